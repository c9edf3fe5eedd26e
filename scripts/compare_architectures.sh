#!/usr/bin/env bash
# Issue 6 comparison: every architecture variant trained on Multi30k De->En with the same
# fixed budget, then scored on test_2016_flickr (beam 5). Prints a markdown table (also in
# runs/compare/results.md) and draws one attention picture per variant for the same sentence.
#   scripts/compare_architectures.sh [RAW_DIR] [variant ...]
set -euo pipefail
raw=${1:-../shared/data/multi30k}
shift || true
data=data/multi30k
out=runs/compare
[ -f "$data/train.de" ] || mt download multi30k --from-dir "$raw" --out "$data"
mkdir -p "$out"
# The fixed budget: 600 updates of about 4,096 tokens (2.4M tokens, about 3 epochs), the
# first 600 steps of the README's Multi30k CPU run; validation (greedy) at steps 300 and 600.
budget=(data.dir=$data train.max_steps=600 train.max_tokens=4096 train.warmup=800
        train.valid_every=300 train.valid_beam=1 train.save_every=300 train.log_every=50
        train.keep_checkpoints=0 train.average_last=0 "decode.tune_beams=[]")
declare -A variants=(
  [rnn-none]="model.arch=rnn model.attention=none"
  [rnn-bahdanau]="model.arch=rnn model.attention=bahdanau"
  [rnn-luong]="model.arch=rnn model.attention=luong"
  [transformer-post]="model.arch=transformer model.norm=post"
  [transformer-pre]="model.arch=transformer model.norm=pre"
  [transformer-learned]="model.arch=transformer model.positional=learned"
  [transformer-relative]="model.arch=transformer model.positional=relative"
  [decoder_only]="model.arch=decoder_only model.dec_layers=6"
)
order=(transformer-post rnn-bahdanau rnn-none decoder_only rnn-luong transformer-pre
       transformer-relative transformer-learned)
[ $# -gt 0 ] && order=("$@")
sentence="Ein kleines Mädchen klettert in ein Spielhaus aus Holz."
for name in "${order[@]}"; do
  run=$out/$name
  start=$(date +%s)
  # shellcheck disable=SC2086
  mt train configs/multi30k_de_en.yaml --run-dir "$run" --set "${budget[@]}" ${variants[$name]} \
    2>&1 | grep -v "^\s*$" > "$run.log"
  echo $(( $(date +%s) - start )) > "$run.seconds"
  mt translate "$run" -i "$data/test.de" -o "$run/test.hyp.en" --beam 5 --force
  mt eval --hyp "$run/test.hyp.en" --ref "$data/test.en" --lc-tok en --json > "$run/test.json"
  mt attention "$run" "$sentence" -o "$out/attention_$name.png" --force > /dev/null 2>&1 || true
  echo "== $name: $(cat "$run.seconds") s, $(tail -1 "$run/test.json")"
done
python - "$out" "${order[@]}" <<'PY' | tee "$out/results.md"
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| variant | parameters | training time | test BLEU | lc-tok BLEU | chrF |")
print("|---|---|---|---|---|---|")
for name in sys.argv[2:]:
    log = (out / f"{name}.log").read_text()
    params = re.search(r"model: ([\d,]+) parameters", log).group(1)
    secs = int((out / f"{name}.seconds").read_text())
    res = json.loads((out / name / "test.json").read_text().strip().splitlines()[-1])
    print(f"| {name} | {params} | {secs / 60:.1f} min | {res['bleu']:.2f} | "
          f"{res['bleu_lc_tok']:.2f} | {res['chrf']:.2f} |")
PY
