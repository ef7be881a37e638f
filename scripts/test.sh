#!/usr/bin/env bash
# The test command: set up, start a real OpenSearch node, run lint, types and every test.
# Extra arguments go to pytest (e.g. scripts/test.sh -k tenant -x).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

scripts/setup.sh --test
scripts/opensearch.sh start

.venv/bin/ruff check .
.venv/bin/mypy
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
[ "$status" -eq 5 ] && { echo "pytest collected no tests" >&2; exit 1; }
exit "$status"
