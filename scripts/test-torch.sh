#!/usr/bin/env bash
# Runs the Python tests that use torch (python/tests/test_buffers.py -k
# torch: bf16/fp16 tensors into the cache and out in place, tensors into
# tables) in a venv of their own, .venv-torch, against the extension that
# `make python` built in crates/python/python. Called by `make test-torch`;
# not part of `make test`, which does not download torch.
#
# torch comes from its CPU-only index where that answers (about 200 MB),
# else from PyPI, whose Linux wheel is the CUDA build: it imports on a
# machine without a GPU too, but pulls several GB of NVIDIA wheels
# (torch 2.15.0: a 5.4 GB venv).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-torch"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet numpy pytest
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    "$venv/bin/pip" install --quiet --timeout 30 torch \
        --index-url https://download.pytorch.org/whl/cpu \
        || "$venv/bin/pip" install --quiet torch
fi
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
cd "$root"
PYTHONPATH="$root/crates/python/python" "$venv/bin/python" -m pytest -q -rs \
    python/tests/test_buffers.py -k torch
