#!/usr/bin/env bash
# Install what mt needs: PyTorch (the CPU build unless an NVIDIA GPU is present, so pip does not
# fetch several GB of CUDA libraries for a laptop), then mt itself with its test extra.
#   bash scripts/setup.sh            TORCH_SPEC=torch==2.13.0 by default; set it to choose
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
spec=${TORCH_SPEC:-torch==2.13.0}
cpu_index=https://download.pytorch.org/whl/cpu
if "$py" -c "import torch" 2>/dev/null; then
  echo "setup: torch $("$py" -c 'import torch; print(torch.__version__)') is already installed"
elif command -v nvidia-smi >/dev/null 2>&1; then
  "$py" -m pip install -q "$spec"                         # PyPI's build includes CUDA
elif "$py" -c "import urllib.request as u; u.urlopen('$cpu_index/', timeout=5)" 2>/dev/null; then
  # PyTorch's own index serves the CPU-only build; PyPI's default build bundles CUDA.
  "$py" -m pip install -q "$spec" --index-url "$cpu_index" --extra-index-url https://pypi.org/simple
else
  echo "setup: $cpu_index is not reachable; installing $spec from the configured index"
  "$py" -m pip install -q "$spec"
fi
"$py" -m pip install -q -e ".[dev]"
