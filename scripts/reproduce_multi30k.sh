#!/usr/bin/env bash
# From the raw Multi30k task-1 corpus to test_2016_flickr scores, both directions.
#   scripts/reproduce_multi30k.sh [RAW_DIR] [extra mt train flags, e.g. --set train.max_steps=2000]
# RAW_DIR holds train|val|test_2016_flickr.{en,de}.gz (default ../shared/data/multi30k; if it
# does not exist, the corpus comes from the HF hub). PAIRS="de_en" runs one direction.
# It stops at the first failure or interrupt (Ctrl-C: `mt train` saves last.pt and exits 130;
# run the script again to resume). A run's earlier test results are kept as *.prev beside the
# new ones, and a lower BLEU than before is said.
set -euo pipefail
raw=${1:-../shared/data/multi30k}
shift || true
data=data/multi30k
if [ ! -f "$data/train.de" ]; then
  if [ -d "$raw" ]; then mt download multi30k --from-dir "$raw" --out "$data"
  else mt download multi30k --out "$data"; fi
fi
bleu() { sed -n 's/^BLEU[^=]*= *\([0-9.]*\).*/\1/p' "$1" | head -1; }
for pair in ${PAIRS:-de_en en_de}; do
  src=${pair%_*}; tgt=${pair#*_}
  run=runs/multi30k_$pair
  hyp=$run/test.hyp.$tgt
  mt train "configs/multi30k_$pair.yaml" --run-dir "$run" --set "data.dir=$data" "$@"
  # the new results are complete before the earlier ones move aside
  mt translate "$run" -i "$data/test.$src" -o "$hyp.new" --force
  mt eval --hyp "$hyp.new" --ref "$data/test.$tgt" --lc-tok "$tgt" > "$run/test.scores.new"
  if [ -f "$run/test.scores" ]; then
    before=$(bleu "$run/test.scores"); now=$(bleu "$run/test.scores.new")
    mv -f "$run/test.scores" "$run/test.scores.prev"
    if [ -f "$hyp" ]; then mv -f "$hyp" "$hyp.prev"; fi
    if [ -n "$before" ] && [ -n "$now" ] && awk "BEGIN { exit !($now < $before) }"; then
      echo "note: BLEU $now is lower than the earlier $before; the earlier results are kept" \
        "as $run/test.scores.prev and $hyp.prev"
    fi
  fi
  mv -f "$hyp.new" "$hyp"
  mv -f "$run/test.scores.new" "$run/test.scores"
  echo "== $src -> $tgt (test_2016_flickr, $(grep -c . "$hyp") lines)"
  cat "$run/test.scores"
done
