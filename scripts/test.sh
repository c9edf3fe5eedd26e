#!/usr/bin/env bash
# Install what is needed and run the default test suite (what CI runs).
#   bash scripts/test.sh             extra arguments go to pytest, e.g. -m slow
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1     # tests use local files, never the hub
${PYTHON:-python3} -m pytest -q "$@"
