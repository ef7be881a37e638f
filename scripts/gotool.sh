#!/usr/bin/env bash
# Go-built tools for the tests (helm for the chart, promtool for the alert rules, Jaeger for the
# traces), each built once per machine from the Go module proxy. scripts/helm.sh,
# scripts/promtool.sh and scripts/jaeger.sh call this.
#
#   scripts/gotool.sh TOOL            print the cached binary's path (building it first if needed)
#   scripts/gotool.sh TOOL ARGS...    run it: scripts/gotool.sh helm lint helm/querygate
#
# Neither Debian nor PyPI packages them, and nothing but the package registries is reachable,
# so `go install MODULE/cmd/TOOL@VERSION` builds them (minutes each; Jaeger, built as a
# module's tool, the largest: docs/testing.md has the times). A binary is kept per machine,
# beside the OpenSearch downloads, under ${XDG_CACHE_HOME:-~/.cache}/querygate/TOOL/<version>/TOOL
# (QUERYGATE_<TOOL>_CACHE overrides the tool's folder): CI clones afresh each run, the machine
# stays. Once built, nothing is fetched, so it works offline. The Go module and build caches of
# the build go to a temporary folder and are removed afterwards; only the binary is kept.
#
# Environment:
#   HELM_VERSION       v3.21.4 (default; v3.22.0 is served but not an approved release)
#   PROMTOOL_VERSION   v0.316.0 (default; Prometheus 3.x's Go module version)
#   JAEGER_VERSION     v1.75.0 (default; the Go module version of Jaeger v2's all-in-one;
#                      v1.76.0 is served but not an approved release)
#   GO                 the go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

TOOL="${1:?usage: scripts/gotool.sh helm|promtool|jaeger [ARGS...]}"
shift
case "$TOOL" in
  helm) VERSION="${HELM_VERSION:-v3.21.4}"; PACKAGE="helm.sh/helm/v3/cmd/helm" ;;
  promtool)
    VERSION="${PROMTOOL_VERSION:-v0.316.0}"
    PACKAGE="github.com/prometheus/prometheus/cmd/promtool"
    # Without the service-discovery plugins (cloud SDKs for AWS, Azure, GCE and a dozen more),
    # which rule checks and rule unit tests never load: about half the packages to compile.
    TAGS="remove_all_sd" ;;
  jaeger)
    VERSION="${JAEGER_VERSION:-v1.75.0}"
    PACKAGE="github.com/jaegertracing/jaeger/cmd/jaeger"
    # Its go.mod has replace directives, which `go install MODULE@VERSION` refuses: it is built
    # as a tool of a throwaway module instead, where (as for any module that requires it) the
    # replaces do not apply and its own requirements' versions are used.
    AS_TOOL=1 ;;
  *) echo "unknown tool: $TOOL (helm, promtool or jaeger)" >&2; exit 2 ;;
esac
CACHE_VAR="QUERYGATE_$(echo "$TOOL" | tr '[:lower:]' '[:upper:]')_CACHE"
CACHE="${!CACHE_VAR:-${XDG_CACHE_HOME:-$HOME/.cache}/querygate/$TOOL}"
BIN_DIR="$CACHE/$VERSION"
BINARY="$BIN_DIR/$TOOL"

log() { printf '[%s] %s\n' "$TOOL" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

go_command() {
  if [ -n "${GO:-}" ]; then echo "$GO"
  elif command -v go >/dev/null; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else die "no Go toolchain (set GO=/path/to/go); $TOOL is built with go install"
  fi
}

build() {
  local go
  go="$(go_command)"
  mkdir -p "$BIN_DIR"
  WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
  trap cleanup EXIT
  log "building $TOOL $VERSION with $("$go" version | cut -d' ' -f3) (once per machine)"
  # Into the temporary folder first, then one rename: a build cut short never leaves a
  # half-written binary where the next run would take it as done. -modcacherw: the module
  # cache is removable afterwards.
  # In a subshell: the Go variables stay out of the tool's own environment.
  (
    export GOBIN="$WORK/bin" GOPATH="$WORK/gopath" GOMODCACHE="$WORK/mod" GOCACHE="$WORK/cache" \
      GOTMPDIR="$WORK" GOFLAGS="-modcacherw -trimpath -ldflags=-s" CGO_ENABLED=0
    if [ "${AS_TOOL:-0}" = 1 ]; then
      mkdir -p "$WORK/module" "$WORK/bin"
      cd "$WORK/module"
      "$go" mod init querygate.local/tools
      "$go" get -tool "$PACKAGE@$VERSION"
      "$go" build -tags="${TAGS:-}" -o "$WORK/bin/$TOOL" "$PACKAGE"
    else
      "$go" install -tags="${TAGS:-}" "$PACKAGE@$VERSION"
    fi
  ) >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; die "building $PACKAGE@$VERSION failed"; }
  "$WORK/bin/$TOOL" --help >/dev/null 2>&1 || die "the built $TOOL does not run"
  mv -f "$WORK/bin/$TOOL" "$BINARY"
  log "cached $BINARY"
  # Now, not at exit: `exec` below would skip an EXIT trap.
  cleanup
  trap - EXIT
}

WORK=""
cleanup() {
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    chmod -R u+w "$WORK" 2>/dev/null || true
    rm -rf "$WORK"
  fi
}

# A lock per cache: two test runs starting together build once.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
[ -x "$BINARY" ] || build
flock -u 9

if [ "$#" -eq 0 ]; then
  echo "$BINARY"
else
  exec "$BINARY" "$@"
fi
