#!/usr/bin/env bash
# Install what mt needs: PyTorch (the CPU build unless an NVIDIA GPU is present, so pip does not
# fetch several GB of CUDA libraries for a laptop), then mt itself with its test extra.
#   bash scripts/setup.sh            TORCH_SPEC=torch==2.13.0 by default; set it to choose
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
spec=${TORCH_SPEC:-torch==2.13.0}
if "$py" -c "import torch" 2>/dev/null; then
  echo "setup: torch $("$py" -c 'import torch; print(torch.__version__)') is already installed"
elif command -v nvidia-smi >/dev/null 2>&1; then
  "$py" -m pip install -q "$spec"                         # PyPI's build includes CUDA
else
  # PyTorch's own index serves the CPU-only build; PyPI's default build bundles CUDA.
  "$py" -m pip install -q "$spec" --index-url https://download.pytorch.org/whl/cpu \
    || { echo "setup: the PyTorch CPU index was not reachable; trying the default index";
         "$py" -m pip install -q "$spec"; }
fi
"$py" -m pip install -q -e ".[dev]"
