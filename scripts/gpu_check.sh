#!/usr/bin/env bash
# The GPU checks of issue 33 ("GPU measured") in one call of a lent GPU machine, which keeps
# nothing between calls and reaches no package index. What it needs travels in .gpu/ (ignored
# by git; scripts/gpu_check.sh --prepare makes it here, where pip works):
#   .gpu/whl/    wheels of mt's dependencies that the GPU image lacks (Python 3.12)
#   .gpu/m30k/   the raw Multi30k files of ../shared/data/multi30k (the real-data tests)
#   .gpu/en_de/  a CPU-trained En->De run (best.pt + its CPU test translation), to decode on both
# On the GPU machine, in the repository root:  bash scripts/gpu_check.sh OUTDIR
# It logs everything to OUTDIR/check.log and ends with a summary; each step has its own time
# limit so that the whole script ends within about 9 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
    set -e
    mkdir -p .gpu/whl .gpu/m30k .gpu/en_de
    grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .gpu/whl pydantic==2.13.4 pydantic_core==2.46.4 \
        annotated-types==0.7.0 typing-inspection==0.4.2 datasets==5.2.0 dill==0.4.1 \
        multiprocess==0.70.19 sacremoses==0.2.0
    cp ../shared/data/multi30k/* .gpu/m30k/
    run=${EN_DE_RUN:-runs/en_de_drop02}
    cp "$run/best.pt" "$run/config.yaml" .gpu/en_de/
    cp "$run/test.hyp.de" .gpu/en_de/cpu.test.hyp.de
    du -sh .gpu
    exit 0
fi

out=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$out"
log=$out/check.log
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec > >(tee -a "$log") 2>&1
step() { echo; echo "=== $(date +%T) $*"; }

step setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .gpu/whl/*.whl || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
mkdir -p ../shared/data && [ -e ../shared/data/multi30k ] || ln -s "$PWD/.gpu/m30k" ../shared/data/multi30k
[ -f data/multi30k/train.de ] || mt download multi30k --from-dir .gpu/m30k --out data/multi30k
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch, mt; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

step "item 5: one CPU-trained checkpoint decoded on the GPU (auto precision, then fp32)"
for prec in auto fp32; do
    t0=$(date +%s.%N)
    timeout 60 mt translate .gpu/en_de/best.pt -i data/multi30k/test.en -o "$out/gpu_$prec.hyp.de" \
        --device cuda --precision "$prec" --force
    echo "decode $prec: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s for the whole command"
    mt eval --hyp "$out/gpu_$prec.hyp.de" --ref data/multi30k/test.de --lc-tok de
    python3 - "$out/gpu_$prec.hyp.de" .gpu/en_de/cpu.test.hyp.de <<'EOF'
import sys
a, b = (open(p).read().splitlines() for p in sys.argv[1:])
print(f"lines identical to the CPU translation: {sum(x == y for x, y in zip(a, b))} of {len(b)}")
EOF
done
mt eval --hyp .gpu/en_de/cpu.test.hyp.de --ref data/multi30k/test.de --lc-tok de

step "item 2: training throughput, bf16"
timeout 110 python3 scripts/bench_train.py --device cuda --precision bf16 --size base --max-tokens 32768 --repeats 2
timeout 70 python3 scripts/bench_train.py --device cuda --precision bf16 --size small --max-tokens 32768 --repeats 1

step "item 3: beam-5 decoding speed, bf16 and fp32"
timeout 80 python3 scripts/bench_decode.py --data-dir data/multi30k --device cuda --precision bf16 --skip-nocache
timeout 40 python3 scripts/bench_decode.py --data-dir data/multi30k --device cuda --precision fp32 --skip-nocache --repeats 1

step "item 1: the test suite on the GPU (item 4's shipped En->De run trains beside it)"
mt train configs/multi30k_en_de.yaml --run-dir runs/gpu_en_de > "$out/train_en_de.log" 2>&1 &
train=$!
timeout ${PYTEST_SECONDS:-170} python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 \
    > "$out/pytest.log" 2>&1
tail -40 "$out/pytest.log"
kill -INT $train 2>/dev/null; sleep 5
cp runs/gpu_en_de/train_log.jsonl "$out/" 2>/dev/null
step "item 4 so far: the shipped En->De config on the GPU"
grep -a -v "it/s" "$out/train_en_de.log" | tail -5
python3 - "$out/train_log.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
valid = [r for r in recs if "valid_bleu" in r]
train = [r for r in recs if "tok_s" in r]
print("valid BLEU by step:", [(r["step"], r["valid_bleu"]) for r in valid])
if train:
    print("last train record:", train[-1])
EOF
step done
