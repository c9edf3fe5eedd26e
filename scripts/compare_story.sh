#!/usr/bin/env bash
# The rest of the attention story on Multi30k German->English, at the fixed budget of
# scripts/compare_architectures.sh (600 updates of about 4,096 tokens, warmup 800, d_model 256,
# 3+3 layers), so that its rows sit beside that table's:
#   ss        the post-LN Transformer with scheduled sampling (two parallel decoder passes;
#             gold probability 1 - step/2,000, floored at 0.75 from update 500) against its
#             plain twin (which is also the autoregressive model of the NAT speed comparison)
#   nat       Mask-Predict (model.arch nat) on the raw corpus, decoded with T = 1, 4, 10
#             iterations; decoding speed against the autoregressive model (scripts/bench/bench_nat.py)
#   pretrain  a low-resource slice (the first 3,000 training pairs) trained with and without an
#             encoder pretrained by masked-LM on all 29,000 German training sentences (the
#             anchor's small shape: 4+4 layers, d_model 128, FFN 256; 600 updates of each)
# Each run is scored on test_2016_flickr (beam 5 for the autoregressive models).
#   scripts/compare_story.sh [RAW_DIR] [ss|nat|pretrain ...]
set -euo pipefail
raw=${1:-../shared/data/multi30k}
shift || true
source "$(dirname "$0")/fixed_budget.sh" "$raw" runs/story

train() {  # NAME CONFIG [KEY=VALUE ...]
  local name=$1
  shift
  train_and_score "$out/$name" "$@"
}

ss() {
  # Linear decay from teacher forcing (k = 1) by c = 1/2,000 per update, floored at 0.75:
  # from update 500 on, a quarter of the previous tokens the decoder reads are its own.
  train transformer-plain "$base"
  train transformer-ss "$base" \
    train.scheduled_sampling.schedule=linear train.scheduled_sampling.k=1.0 \
    train.scheduled_sampling.c=0.0005 train.scheduled_sampling.min_gold=0.75
}

nat() {
  train nat "$base" model.arch=nat
  [ -d "$out/transformer-plain" ] || train transformer-plain "$base"
  python scripts/bench/bench_nat.py --nat "$out/nat" --ar "$out/transformer-plain" \
    --data-dir "$data" --json "$out/nat_bench.json" | tee "$out/nat_bench.txt"
}

pretrain() {
  local slice=data/multi30k_3k shape=(model.enc_layers=4 model.dec_layers=4 model.d_model=128
        model.d_ff=256 model.n_heads=4)
  mkdir -p "$slice"
  for lang in de en; do
    head -n 3000 "$data/train.$lang" > "$slice/train.$lang"
    cp "$data/valid.$lang" "$data/test.$lang" "$slice/"
  done
  # The encoder learns German from all 29,000 training sources (no English is read).
  mt pretrain "$base" --run-dir "$out/mlm" --set data.dir=$data \
    train.max_steps=1000 train.max_tokens=4096 train.warmup=800 train.log_every=100 \
    "${shape[@]}" 2>&1 | grep -v "^\s*$" > "$out/mlm.log"
  # Both slice runs use the pretraining's BPE model, so only the encoder's start differs.
  mkdir -p "$out/slice-plain"
  cp "$out/mlm/spm.model" "$out/slice-plain/"
  train slice-plain "$base" "${shape[@]}" data.dir=$slice
  train slice-mlm "$base" "${shape[@]}" data.dir=$slice \
    model.init_encoder=$out/mlm/pretrained.pt
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(ss nat pretrain)
for part in "${parts[@]}"; do "$part"; done
runs=()
for name in transformer-plain transformer-ss nat slice-plain slice-mlm; do
  [ -f "$out/$name/test.json" ] && runs+=("$name")
done
results_table "$out" "${runs[@]}" | tee "$out/results.md"
