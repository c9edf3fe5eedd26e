#!/usr/bin/env bash
# The architectures compared: every variant trained on Multi30k De->En with the same
# fixed budget, then scored on test_2016_flickr (beam 5). Prints a markdown table (also in
# runs/compare/results.md) and draws one attention picture per variant for the same sentence.
#   scripts/compare_architectures.sh [RAW_DIR] [variant ...]
set -euo pipefail
raw=${1:-../shared/data/multi30k}
shift || true
source "$(dirname "$0")/fixed_budget.sh" "$raw" runs/compare
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
  # shellcheck disable=SC2086
  train_and_score "$out/$name" "$base" ${variants[$name]}
  mt attention "$out/$name" "$sentence" -o "$out/attention_$name.png" --force > /dev/null 2>&1 || true
done
results_table "$out" "${order[@]}" | tee "$out/results.md"
