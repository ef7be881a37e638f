#!/usr/bin/env bash
# The helm binary for the chart's tests, built once per machine from the Go module proxy.
#
#   scripts/helm.sh            print the cached binary's path (building it first if needed)
#   scripts/helm.sh ARGS...    run it: scripts/helm.sh lint helm/querygate
#
# Neither Debian nor PyPI packages helm, and nothing but the package registries is reachable,
# so `go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION` builds it (~90 s on 2 cores). The
# binary is kept per machine, beside the OpenSearch downloads, under
# ${XDG_CACHE_HOME:-~/.cache}/querygate/helm/<version>/helm (QUERYGATE_HELM_CACHE overrides the
# helm folder): CI clones afresh each run, the machine stays. Once built, nothing is fetched, so
# it works offline. The Go module and build caches of the build go to a temporary folder and are
# removed afterwards; only the binary is kept.
#
# Environment:
#   HELM_VERSION   v3.22.0 (default)
#   GO             the go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${QUERYGATE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/querygate/helm}"
BIN_DIR="$CACHE/$HELM_VERSION"
HELM="$BIN_DIR/helm"

log() { printf '[helm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

go_command() {
  if [ -n "${GO:-}" ]; then echo "$GO"
  elif command -v go >/dev/null; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else die "no Go toolchain (set GO=/path/to/go); helm is built with go install"
  fi
}

build() {
  local go
  go="$(go_command)"
  mkdir -p "$BIN_DIR"
  WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
  trap cleanup EXIT
  log "building helm $HELM_VERSION with $("$go" version | cut -d' ' -f3) (once per machine)"
  # Into the temporary folder first, then one rename: a build cut short never leaves a
  # half-written binary where the next run would take it as done. -modcacherw: the module
  # cache is removable afterwards.
  GOBIN="$WORK/bin" GOPATH="$WORK/gopath" GOMODCACHE="$WORK/mod" GOCACHE="$WORK/cache" \
    GOTMPDIR="$WORK" GOFLAGS="-modcacherw" CGO_ENABLED=0 \
    "$go" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log" >&2; die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"; }
  "$WORK/bin/helm" version --short >/dev/null || die "the built helm does not run"
  mv -f "$WORK/bin/helm" "$HELM"
  log "cached $HELM"
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
[ -x "$HELM" ] || build
flock -u 9

if [ "$#" -eq 0 ]; then
  echo "$HELM"
else
  exec "$HELM" "$@"
fi
