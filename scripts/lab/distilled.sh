#!/usr/bin/env bash
# Sequence-level distillation of a teacher (a run, an ensemble of members: train.members, or
# several runs) into one model of the shipped shape, at the config's full budget
# (docs/multi30k_recipe.md, "Several models at once"):
#   scripts/lab/distilled.sh TEACHER NAME [KEY=VALUE ...]
# 1. mt distill: the teacher's beam translations of the training sources become the training
#    targets of data/multi30k_kd_TEACHER (valid and test copied unchanged; made once, shared
#    by the runs of one teacher);
# 2. with BOTH=1 the original pairs join them as a second corpus of the same weight
#    (data.corpora: train.orig.*), as Kim & Rush (2016) also tried;
# 3. mt train CONFIG (default configs/multi30k_en_de.yaml) on it into runs/NAME, with the
#    KEY=VALUE overrides; its summary to runs/NAME.summary.
set -euo pipefail
teacher=$1
name=$2
shift 2
config=${CONFIG:-configs/multi30k_en_de.yaml}
data=${DATA:-data/multi30k}
kd=${data}_kd_$(basename "$teacher")
src=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['data']['src_lang'])" "$config")
tgt=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['data']['tgt_lang'])" "$config")
[ -f "$kd/train.$tgt" ] || mt distill "$teacher" --data "$data" --out "$kd"
sets=("data.dir=$kd")
if [ "${BOTH:-0}" = 1 ]; then
    cp "$data/train.$src" "$kd/train.orig.$src"
    cp "$data/train.$tgt" "$kd/train.orig.$tgt"
    sets+=("data.corpora=[{name: orig, weight: 1}]")
fi
start=$(date +%s)
mt train "$config" --run-dir "runs/$name" --set "${sets[@]}" "$@" 2>&1 | tr '\r' '\n' \
    | grep -v "it/s" > "runs/$name.log"
echo "wall: $(( $(date +%s) - start )) s" >> "runs/$name.log"
python3 scripts/lab/recipe_summary.py "runs/$name" | tee "runs/$name.summary"
