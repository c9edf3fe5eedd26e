#!/usr/bin/env bash
# The code checks CI runs before the tests (and .pre-commit-config.yaml runs locally): ruff's
# lint rules, ruff's formatting, mypy over mt/. Any finding fails.
#   bash scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
"$py" -m ruff check .
"$py" -m ruff format --check .
"$py" -m mypy
