#!/usr/bin/env bash
# The GPU check in one command, for a machine with a CUDA GPU and no network (torch, jax,
# optax, safetensors, xxhash, scikit-learn and pytest installed): installs this checkout
# without dependencies into a private directory, then runs benchmarks/gpu_check.py (the kit
# on the GPU, resume exactness, native model state). Reports go to $OUT (default ./gpu-check).
#
#   bash benchmarks/gpu_check.sh [torch jax]
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(mktemp -d)
python3 -m pip install -q --no-deps --no-build-isolation --target "$site" . >/dev/null
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch and jax share the GPU
export CUBLAS_WORKSPACE_CONFIG=:4096:8       # deterministic cuBLAS, before any CUDA context
export PYTHONHASHSEED=0
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
python3 benchmarks/gpu_check.py "$@" --out "${OUT:-gpu-check}"
