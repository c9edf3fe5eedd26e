#!/usr/bin/env bash
# From the raw Multi30k task-1 corpus to test_2016_flickr scores, both directions.
#   scripts/reproduce_multi30k.sh [RAW_DIR] [extra mt train flags, e.g. --set train.max_steps=2000]
# RAW_DIR holds train|val|test_2016_flickr.{en,de}.gz (default ../shared/data/multi30k; if it
# does not exist, the corpus comes from the HF hub). PAIRS="de_en" runs one direction.
set -euo pipefail
raw=${1:-../shared/data/multi30k}
shift || true
data=data/multi30k
if [ ! -f "$data/train.de" ]; then
  if [ -d "$raw" ]; then mt download multi30k --from-dir "$raw" --out "$data"
  else mt download multi30k --out "$data"; fi
fi
for pair in ${PAIRS:-de_en en_de}; do
  src=${pair%_*}; tgt=${pair#*_}
  run=runs/multi30k_$pair
  mt train "configs/multi30k_$pair.yaml" --run-dir "$run" --set "data.dir=$data" "$@"
  mt translate "$run" -i "$data/test.$src" -o "$run/test.hyp.$tgt" --force
  echo "== $src -> $tgt (test_2016_flickr, $(grep -c . "$run/test.hyp.$tgt") lines)"
  mt eval --hyp "$run/test.hyp.$tgt" --ref "$data/test.$tgt" --lc-tok "$tgt" | tee "$run/test.scores"
done
