#!/usr/bin/env bash
# Step-matched recipe runs on the valid split (docs/multi30k_recipe.md, "Three kinds of
# comparison"): the shipped config cut to a fixed number of updates, at one thread, so that two
# runs share the 2-core CPU side by side and still train exactly as they would alone (a run
# stopped by updates, not by the clock, does not depend on the load beside it).
#   scripts/lab/step_matched.sh NAME [KEY=VALUE ...]     e.g. scripts/lab/step_matched.sh cool30 train.cooldown=0.3
# CONFIG (default configs/multi30k_en_de.yaml) and STEPS (default 8000) may be set; the run
# goes to runs/step_matched/NAME, its summary to runs/step_matched/NAME.summary.
set -euo pipefail
name=$1
shift
config=${CONFIG:-configs/multi30k_en_de.yaml}
run=runs/step_matched/$name
mkdir -p runs/step_matched
[ -f data/multi30k/train.de ] || mt download multi30k --from-dir ../shared/data/multi30k --out data/multi30k
start=$(date +%s)
OMP_NUM_THREADS=1 mt train "$config" --run-dir "$run" --set "train.max_steps=${STEPS:-8000}" \
  train.max_minutes=0 train.num_threads=1 "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s" > "$run.log"
echo "wall: $(( $(date +%s) - start )) s" >> "$run.log"
python scripts/lab/recipe_summary.py "$run" | tee "$run.summary"
