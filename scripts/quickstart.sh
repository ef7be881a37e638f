#!/usr/bin/env bash
# Set up and run the gateway on the embedded default (no servers), with the offline Wikipedia
# sample ingested for the demo tenant on first run, in the background: the port opens at once
# and answers from what is indexed so far, each saying so (partial_index) until it is complete;
# /readyz ("complete", "ingest") and stderr show how far and how long the rest will take.
# Arguments go to `querygate serve`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
scripts/setup.sh
exec .venv/bin/querygate serve --sample-corpus "$@"
