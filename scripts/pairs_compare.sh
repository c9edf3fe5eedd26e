#!/usr/bin/env bash
# One model for En->De, En->Fr and En->Cs (configs/multi30k_en_x.yaml) against a bilingual model
# for each direction (configs/multi30k_en_de.yaml, its target language changed), both of the
# bilingual recipe's shape (FFN 256; PAIRS_SET="model.d_ff=512" for the multilingual config's)
# and as many BPE pieces a language (5k for two languages, 10k for four), each direction
# getting as many of its batches: STEPS updates for a bilingual run, 3 x STEPS for the
# multilingual one (a third of each batch from each pair), both ending on a cool-down of the
# learning rate.
# Each direction is scored on test_2016_flickr with the run's tuned beam: cased sacreBLEU and
# lowercased tokenized BLEU. Prints a markdown table; the runs stay in OUT, and rerunning the
# same command resumes them.
#   bash scripts/pairs_compare.sh OUT STEPS [DATA_DIR]    (DATA_DIR: data/multi30k)
#   PAIRS_JOBS=2 ...: the three bilingual runs and the multilingual one side by side, one CPU
#                     thread each (a 2-core machine; the same updates, about half the time)
#   PAIRS_SET="model.d_ff=512 ..." ...: --set options for both kinds of run (another size)
#   PAIRS_ONLY="en_fr en_x" ...: these runs alone (en_de, en_fr, en_cs, en_x); the table once
#                     every run is there
#   PAIRS_DRY=1 ...: tiny models, for the tests
set -euo pipefail
out=$1
steps=$2
data=${3:-data/multi30k}
mkdir -p "$out"
# The learning rate per direction's batch is the same in both kinds of run: the bilingual runs
# take the recipe's warm-up (2,000) and peak (lr_factor 2.5: 0.005), or half their budget where
# that is shorter, lr_factor scaled by sqrt(warmup / 2000) so that the peak stays 0.005 (a short
# budget should neither end before its peak nor reach a higher one: a warm-up of 500 at
# lr_factor 2.5 peaks at 0.01, where this post-LN model stalls); the multilingual run, whose
# update 3k is each direction's batch k, warms up for three times the updates, lr_factor
# scaled by sqrt(3), so that its learning rate at update 3k is the bilingual one's at k.
warmup=$(( steps / 2 < 2000 ? steps / 2 : 2000 ))
warmup=$(( warmup > 0 ? warmup : 1 ))
schedule() {  # WARMUP: the --set of a Noam schedule that peaks at 0.005 after WARMUP updates
  echo "train.warmup=$1 train.lr_factor=$(python -c "print(round(2.5 * ($1 / 2000) ** .5, 6))")"
}
# both kinds of run of the bilingual recipe's shape (the multilingual config's FFN is wider),
# unless PAIRS_SET says otherwise
recipe() {  # SECTION KEY: the bilingual recipe's value
  python -c "import yaml, sys; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]])" \
    configs/multi30k_en_de.yaml "$1" "$2"
}
# both end annealed (the learning rate to 0 over the last 30%): at this budget the multilingual
# model's last weights are the noisier, and En->Fr trailed by 2.13 BLEU without
budget=(data.dir="$data" train.max_minutes=0 train.log_every=100 train.valid_beam=1
        train.average_last=4 train.cooldown=0.3 model.d_ff="$(recipe model d_ff)")
# as many BPE pieces a language: the bilingual vocabulary holds two languages, the
# multilingual one four
vocab=$(recipe tokenizer vocab_size)
# shellcheck disable=SC2206  # (PAIRS_SET's options split on purpose)
budget+=(${PAIRS_SET:-})
if [ -n "${PAIRS_DRY:-}" ]; then
  vocab=300
  budget+=(model.d_model=32 model.d_ff=64 model.enc_layers=1 model.dec_layers=1
           train.max_tokens=1024 "decode.tune_beams=[1]"
           train.log_every=5 train.average_last=0 data.dataset=null)
fi

wanted() {  # RUN: whether PAIRS_ONLY (empty: every run) names it
  [[ -z "${PAIRS_ONLY:-}" || " $PAIRS_ONLY " == *" $1 "* ]]
}

train() {  # RUN CONFIG STEPS [KEY=VALUE ...]: valid at half and the end, snapshots every eighth
  local run=$1 config=$2 n=$3 start
  shift 3
  [ -f "$out/$run.seconds" ] && return 0  # done (and timed) before
  start=$(date +%s)
  # the run's own options first, so that PAIRS_SET and the dry run's sizes override them
  mt train "$config" --run-dir "$out/$run" --set "$@" "${budget[@]}" train.max_steps="$n" \
    train.valid_every=$(( n > 1 ? n / 2 : 1 )) train.save_every=$(( n > 7 ? n / 8 : 1 )) \
    2>&1 | tr '\r' '\n' | grep -v "^\s*$\|it/s" > "$out/$run.log"
  echo $(( $(date +%s) - start )) > "$out/$run.seconds"
}

score() {  # RUN LANG [FLAGS ...]: OUT/RUN/test.LANG.json
  local run=$1 lang=$2
  shift 2
  mt translate "$out/$run" -i "$data/test.en" -o "$out/$run/test.hyp.$lang" --force "$@" 2>/dev/null
  mt eval --hyp "$out/$run/test.hyp.$lang" --ref "$data/test.$lang" --lc-tok "$lang" --json \
    | tail -1 > "$out/$run/test.$lang.json"
  echo "== $run -> $lang: $(cat "$out/$run/test.$lang.json")"
}

bilingual() {
  for lang in de fr cs; do
    wanted "en_$lang" || continue
    train "en_$lang" configs/multi30k_en_de.yaml "$steps" data.tgt_lang="$lang" \
      tokenizer.vocab_size="$vocab" $(schedule "$warmup")
    score "en_$lang" "$lang"
  done
}

multilingual() {
  wanted en_x || return 0
  train en_x configs/multi30k_en_x.yaml $(( 3 * steps )) $(schedule $(( 3 * warmup ))) \
    tokenizer.vocab_size=$(( 2 * vocab ))
  for lang in de fr cs; do
    score en_x "$lang" --tgt-lang "$lang"
  done
}

if [ "${PAIRS_JOBS:-1}" = 2 ]; then
  export OMP_NUM_THREADS=1 MT_THREADS=1
  bilingual & side=$!
  multilingual
  wait "$side"
else
  bilingual
  multilingual
fi

for run in en_de en_fr en_cs en_x; do
  [ -f "$out/$run.seconds" ] || { echo "pairs_compare: $out/$run is not done yet; no table"; exit 0; }
done
python - "$out" "$steps" <<'PY'
import json, re, sys
from pathlib import Path
out, steps = Path(sys.argv[1]), int(sys.argv[2])
def params(run):
    return re.search(r"model: ([\d,]+) parameters", (out / f"{run}.log").read_text()).group(1)
def minutes(run):
    return int((out / f"{run}.seconds").read_text()) / 60
print(f"| direction | bilingual BLEU / lc-tok | multilingual BLEU / lc-tok | difference |")
print("|---|---|---|---|")
for lang in ("de", "fr", "cs"):
    bi = json.loads((out / f"en_{lang}" / f"test.{lang}.json").read_text())
    multi = json.loads((out / "en_x" / f"test.{lang}.json").read_text())
    print(f"| en-{lang} | {bi['bleu']:.2f} / {bi['bleu_lc_tok']:.2f} | "
          f"{multi['bleu']:.2f} / {multi['bleu_lc_tok']:.2f} | {multi['bleu'] - bi['bleu']:+.2f} |")
print()
each = " / ".join(f"{minutes('en_' + x):.0f}" for x in ("de", "fr", "cs"))
print(f"bilingual: {steps:,} updates each, {params('en_de')} parameters (en-de), {each} "
      f"minutes; multilingual: {3 * steps:,} updates, {params('en_x')} parameters, "
      f"{minutes('en_x'):.0f} minutes")
PY
