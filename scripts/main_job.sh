#!/usr/bin/env bash
# The main job on a fresh machine: install, import Multi30k, train German->English with the
# shipped config, translate test_2016_flickr and score it.
#   bash scripts/main_job.sh [RAW_DIR]    RAW_DIR: the raw Multi30k files (default
#                                         ../shared/data/multi30k; absent: the HF hub)
#   PAIRS="de_en en_de" bash scripts/main_job.sh    both directions
# Stops at the first failure; Ctrl-C stops it too (the training saves last.pt and exits 130:
# running the script again resumes). Earlier test results are kept as *.prev.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PAIRS=${PAIRS:-de_en} bash scripts/reproduce_multi30k.sh "${1:-../shared/data/multi30k}"
