#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment .venv with pinned versions.
# Idempotent: a stamp file records the hash of requirements.txt + this script; a matching stamp skips work.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=${VENV:-.venv}
stamp="$VENV/.knnlm-setup-stamp"
want=$( (cat requirements.txt scripts/setup.sh pyproject.toml; echo "${1:-}") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $VENV is up to date"; exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip="$VENV/bin/python -m pip --disable-pip-version-check -q"
# torch first and pinned: the CPU wheel. Any other spec pulls CUDA packages.
$pip install torch==2.13.0
$pip install -r requirements.txt
# --gpu (GPU clusters, with internet): faiss-gpu instead of faiss-cpu, same version and API. torch==2.13.0 from
# PyPI is already the CUDA build on Linux x86-64 there (only this machine's local wheel is CPU-only).
if [ "${1:-}" = "--gpu" ]; then
  $pip uninstall -y faiss-cpu
  $pip install faiss-gpu==1.15.1
fi
# fairseq 0.12 patched for Python 3.11 (source build, ~2 min). --no-deps keeps torchaudio out.
$VENV/bin/python -c "import fairseq" 2>/dev/null || $pip install --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
$pip install --no-deps -e .
echo "$want" > "$stamp"
echo "setup: $VENV ready"
