#!/usr/bin/env bash
# The test command: set up, start real OpenSearch nodes, get helm, promtool and Jaeger, run lint,
# types and every test.
# Extra arguments go to pytest (e.g. scripts/test.sh -k tenant -x).
#
# Two nodes: 3.5.0 (the pinned version) serves the whole suite; 2.19.1 is the one whose
# neural-search plugin is on Maven Central, so the retriever's tests run again on it to check
# that server-side RRF gives the same results as client-side fusion (docs/opensearch.md).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# Ports are overridable so a second checkout can test beside a running development node.
export OPENSEARCH_PORT="${OPENSEARCH_PORT:-9200}"
RRF_PORT="${OPENSEARCH_RRF_PORT:-9201}"
export OPENSEARCH_URL="http://127.0.0.1:$OPENSEARCH_PORT"

# The Go tools (helm for the chart, promtool for the alert rules, Jaeger's all-in-one for the
# traces) are built once per machine from the Go module proxy, then cached: minutes each on a
# fresh machine, so they build in the background while Python and OpenSearch are set up and the
# tests that do not need them run. The tests that need them fail rather than skip without them
# (QUERYGATE_REQUIRE_*).
TOOLS="$(mktemp -d)"
declare -A BUILDING
for tool in helm promtool jaeger; do
  scripts/"$tool".sh >"$TOOLS/$tool" 2>"$TOOLS/$tool.log" &
  BUILDING[$tool]=$!
done
built() {  # waits for the tool's build (if any); its binary's path is then in $TOOLS/TOOL
  if ! wait "${BUILDING[$1]}"; then
    cat "$TOOLS/$1.log" >&2
    echo "scripts/$1.sh failed" >&2
    exit 1
  fi
  stamp "$1 ready"
}
# Each step's end, in seconds since the start: where a slow run's time went.
stamp() { echo "[test.sh] $1 at ${SECONDS}s" >&2; }

scripts/setup.sh --test
stamp "setup"
# The node installs the distribution that the cluster fault test
# (tests/e2e/test_opensearch_cluster_faults.py) starts three more nodes from, on ports
# QUERYGATE_OPENSEARCH_CLUSTER_PORTS (9230-9232); that test fails when they cannot start.
# The nodes install and start (downloads, unzips, plugin installs: minutes on a fresh machine)
# while lint and types run.
(
  scripts/opensearch.sh start
  OPENSEARCH_VERSION=2.19.1 OPENSEARCH_PORT="$RRF_PORT" scripts/opensearch.sh start
) 2>"$TOOLS/opensearch.log" &
NODES=$!
# bubblewrap runs the gateway under the chart's pod conditions (tests/e2e/test_pod_conditions.py).
if ! command -v bwrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi
export QUERYGATE_REQUIRE_BWRAP=1

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
stamp "lint and types"
if ! wait "$NODES"; then
  cat "$TOOLS/opensearch.log" >&2
  exit 1
fi
cat "$TOOLS/opensearch.log" >&2
stamp "OpenSearch nodes"

# pytest in two phases, so that a fresh machine tests while the Go tools build. The first runs
# every test not marked `gotools`; the tools' variables name a file that does not exist during
# it, so a test that needs a Go tool and lacks the mark fails instead of finding a cached binary
# on one machine and not on another. The second waits for the tools and runs the marked tests.
# The first phase runs on QUERYGATE_TEST_WORKERS pytest-xdist workers (2 by default, one file
# to a worker; 1 runs it in one process): most of the process tier waits on the processes it
# starts, so one process leaves a core idle (docs/testing.md has the figures).
WORKERS="${QUERYGATE_TEST_WORKERS:-2}"
PARALLEL=()
[ "$WORKERS" -gt 1 ] && PARALLEL=(-n "$WORKERS" --dist loadfile)
FAILED=0
COLLECTED=0
run_pytest() {  # nothing collected (exit 5) is fine for one phase, a broken suite for both
  set +e
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
  local status=$?
  set -e
  case "$status" in
    0) COLLECTED=1 ;;
    5) ;;
    *) COLLECTED=1; FAILED=1 ;;
  esac
}

NOT_BUILT="$TOOLS/not-built-yet"
before_tools() {  # run_pytest with each Go tool's variable naming a file that does not exist
  QUERYGATE_HELM="$NOT_BUILT/helm" QUERYGATE_PROMTOOL="$NOT_BUILT/promtool" \
    QUERYGATE_JAEGER="$NOT_BUILT/jaeger" QUERYGATE_REQUIRE_HELM=1 QUERYGATE_REQUIRE_PROMTOOL=1 \
    QUERYGATE_REQUIRE_JAEGER=1 run_pytest "$@"
}
# The retriever's tests on the 2.19.1 node run beside the first phase (which mostly waits on
# the processes it starts), their output printed once both are done.
(
  OPENSEARCH_URL="http://127.0.0.1:$RRF_PORT" before_tools tests/integration/test_opensearch_retriever.py
  exit "$FAILED"
) >"$TOOLS/rrf.log" 2>&1 &
RRF=$!
before_tools "${PARALLEL[@]}" -m "not gotools" "$@"
stamp "first phase"
RRF_STATUS=0
wait "$RRF" || RRF_STATUS=$?
cat "$TOOLS/rrf.log"
case "$RRF_STATUS" in
  0) COLLECTED=1 ;;
  *) COLLECTED=1; FAILED=1 ;;
esac

built helm
QUERYGATE_HELM="$(cat "$TOOLS/helm")"
export QUERYGATE_HELM QUERYGATE_REQUIRE_HELM=1
"$QUERYGATE_HELM" lint --strict helm/querygate
# promtool checks the alert rules and runs their unit tests (tests/alerts/).
built promtool
QUERYGATE_PROMTOOL="$(cat "$TOOLS/promtool")"
export QUERYGATE_PROMTOOL QUERYGATE_REQUIRE_PROMTOOL=1
# Jaeger receives the gateway's traces and serves them back to tests/e2e/test_tracing.py.
built jaeger
QUERYGATE_JAEGER="$(cat "$TOOLS/jaeger")"
export QUERYGATE_JAEGER QUERYGATE_REQUIRE_JAEGER=1
rm -rf "$TOOLS"
run_pytest -m gotools "$@"
stamp "second phase"

[ "$COLLECTED" -eq 1 ] || { echo "pytest collected no tests" >&2; exit 1; }
exit "$FAILED"
