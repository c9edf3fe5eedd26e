#!/usr/bin/env bash
# Check that pyproject's lower bounds are true: a fresh venv gets every dependency at exactly
# its lower bound (torch from PyTorch's CPU index), mt without its dependencies, and the fast
# tests run there.
#   bash scripts/lab/check_min_versions.sh [VENV_DIR [PYTEST ARGS...]]   (default /tmp/mt-min-venv)
#   TORCH_SPEC=torch==2.13.0 bash scripts/lab/check_min_versions.sh   another torch, e.g. offline
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-/tmp/mt-min-venv}
shift || true
rm -rf "$venv"
python3 -m venv "$venv"
py="$venv/bin/python"
pins=$("$py" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
deps += tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]
for d in deps:
    name, low = re.match(r"^([A-Za-z0-9_.-]+)>=([^,;\s]+)", d).groups()
    print(f"{name}=={low}")
PY
)
torch_pin=$(echo "$pins" | grep '^torch==')
spec=${TORCH_SPEC:-$torch_pin}
echo "== torch: $spec"
cpu_index=https://download.pytorch.org/whl/cpu
if "$py" -c "import urllib.request as u; u.urlopen('$cpu_index/', timeout=5)" 2>/dev/null; then
  "$py" -m pip install -q "$spec" --index-url "$cpu_index" --extra-index-url https://pypi.org/simple
else
  "$py" -m pip install -q "$spec"
fi
others=$(echo "$pins" | grep -v '^torch==')
echo "== the others at their lower bounds:" $others
# shellcheck disable=SC2086
"$py" -m pip install -q $others
"$py" -m pip install -q --no-deps -e .
"$py" -m pip list 2>/dev/null | grep -iE "^($(echo "$pins" | sed 's/==.*//' | paste -sd'|')) "
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$py" -m pytest -q -x -p no:cacheprovider "$@"
