# Sourced by compare_architectures.sh and compare_story.sh: the Multi30k corpus, the fixed
# training budget of the README's comparison tables, and one run trained, timed and scored.
#   source scripts/fixed_budget.sh RAW_DIR OUT    (runs go to the folder OUT, made here)
data=data/multi30k
[ -f "$data/train.de" ] || mt download multi30k --from-dir "$1" --out "$data"
out=$2
mkdir -p "$out"
# The fixed budget: 600 updates of about 4,096 tokens (2.4M tokens, about 3 epochs), the
# first 600 steps of the README's Multi30k CPU run; validation (greedy) at steps 300 and 600.
# The base config is the d256 shape the README's tables were measured with, not the shipped
# CPU-sized recipe.
base=configs/multi30k_de_en_d256.yaml
budget=(data.dir=$data train.max_steps=600 train.max_tokens=4096 train.warmup=800
        train.valid_every=300 train.valid_beam=1 train.save_every=300 train.log_every=50
        train.keep_checkpoints=0 train.average_last=0 "decode.tune_beams=[]")

train_and_score() {  # RUN CONFIG [KEY=VALUE ...]: the budget plus these overrides; RUN.log,
  # RUN.seconds (wall clock of mt train), RUN/test.json (test_2016_flickr, beam 5)
  local run=$1 config=$2 start
  shift 2
  start=$(date +%s)
  mt train "$config" --run-dir "$run" --set "${budget[@]}" "$@" 2>&1 | tr '\r' '\n' \
    | grep -v "^\s*$\|it/s" > "$run.log"
  echo $(( $(date +%s) - start )) > "$run.seconds"
  mt translate "$run" -i "$data/test.de" -o "$run/test.hyp.en" --beam 5 --force 2>/dev/null
  mt eval --hyp "$run/test.hyp.en" --ref "$data/test.en" --lc-tok en --json > "$run/test.json"
  echo "== $(basename "$run"): $(cat "$run.seconds") s, $(tail -1 "$run/test.json")"
}

results_table() {  # OUT NAME ...: a markdown row per run OUT/NAME trained by train_and_score
  python - "$@" <<'PY'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | parameters | training | valid BLEU (greedy) at 300 / 600 | test BLEU | "
      "lc-tok BLEU | chrF |")
print("|---|---|---|---|---|---|---|")
for name in sys.argv[2:]:
    params = re.search(r"model: ([\d,]+) parameters", (out / f"{name}.log").read_text()).group(1)
    secs = int((out / f"{name}.seconds").read_text())
    log = [json.loads(line) for line in open(out / name / "train_log.jsonl")]
    valid = {r["step"]: r["valid_bleu"] for r in log if "valid_bleu" in r}
    res = json.loads((out / name / "test.json").read_text().strip().splitlines()[-1])
    print(f"| {name} | {params} | {secs / 60:.1f} min | {valid.get(300)} / {valid.get(600)} | "
          f"{res['bleu']:.2f} | {res['bleu_lc_tok']:.2f} | {res['chrf']:.2f} |")
PY
}
