#!/usr/bin/env bash
# The checks and measurements that need a CUDA GPU, run on a GPU machine that keeps nothing
# between calls and reaches no package index. What it needs travels in .gpu/ (ignored by git;
# scripts/gpu_check.sh --prepare makes it here, where pip works):
#   .gpu/whl/    wheels of mt's dependencies that the GPU image lacks (Python 3.12)
#   .gpu/m30k/   the raw Multi30k files of ../shared/data/multi30k (the real-data tests)
#   .gpu/en_de/  a CPU-trained En->De run (best.pt + its CPU test translation), to decode on both
# On the GPU machine, in the repository root:  bash scripts/gpu_check.sh OUTDIR [PART ...]
#
# Fifteen minutes of GPU time, the machine's start included, fit two calls (docs/gpu.md), each
# part keeping its own time budget and writing each JSON line the moment its phase ends:
#   bash scripts/gpu_check.sh OUT first    job decode, limit 540 s: every figure of the user's
#                                          job and of decoding, the trained run kept in OUT/run
#   bash scripts/gpu_check.sh OUT second   cudatests, limit 230 s, on the same machine at once
# The default, mfu and m30k, takes at most 5 minutes on a fresh machine, installs included.
# Send the checkout with .gpu/ beside it (a machine that receives a copy of the checkout gets
# the ignored .gpu/ only when it is named among the paths carried over) and take back OUT
# (OUT/PART.json, one JSON line a phase, and OUT/check.log).
#   bash scripts/gpu_check.sh --dry-run OUT first   the same parts on the CPU at tiny sizes
#                                                   (the tests run this; GPU_CHECK_SCALE
#                                                   scales every part's budget)
# PARTs:
#   job          the user's whole job as the README gives it: the shipped En->De config trained
#                to its end with the defaults (within JOB_SECONDS, 340: the training gets what
#                translating and scoring leave), test_2016_flickr translated (beam 5) and
#                scored (scripts/bench/gpu_job.py job): each phase's seconds, the steady
#                updates/s, compile and validation time apart, recompiles and skipped CUDA
#                graphs, the BLEU; the run's best.pt and log kept in OUT/run (JOB_RUN=)
#   decode       the 1,000 test sentences with the run `job` trained (or JOB_RUN), greedy and
#                beam 5, eager against the compiled step: first call (compiles), second call,
#                a second process on the warm compile cache; sentences/s, graphs, recompiles,
#                equal outputs; within DECODE_SECONDS (120)
#   mfu          the base model (6+6, d 512, vocabulary 32k) on packed blocks of one shape,
#                compiled once, bf16: target tokens/s and MFU (scripts/bench/gpu_figures.py)
#   m30k         the shipped En->De config packed and compiled: updates/s after the compile and
#                the whole run's forecast at that rate
#   profile      where an update's time goes before any cut: torch.profiler over 20 base-model
#                updates and 200 Multi30k ones (scripts/bench/gpu_profile.py): the top kernels,
#                host and device ms per update, the timeline of 3 updates; at most 3 min
#   ablate       which cut pays: the base model's step with rows 128 and 256 wide, Inductor's
#                max-autotune, FlexAttention blocks of 64, the loss in chunks, the whole update
#                as one CUDA graph, a JSON line each in OUT/ablate_base.json
#                (scripts/bench/gpu_ablate.py), about 7 min
#   ablatem30k   the same for the Multi30k config (rows 128 and 256 wide, the whole update as
#                one CUDA graph, with its loss in chunks): OUT/ablate_m30k.json, about 4 min
#   pairs        several pairs against one each (scripts/pairs_compare.sh): the multilingual
#                En->{De,Fr,Cs} model against a bilingual one a direction, PAIRS_STEPS (6,000)
#                batches a direction, PAIRS_SET for both kinds (another size); the table in
#                OUT/pairs.md, the runs in runs/gpu_pairs (a second call on a warm machine resumes)
#   cudatests    tests/test_cuda.py alone (the paths only a GPU takes), within CUDATEST_SECONDS
#                (150)
#   host         the host's work per update (scripts/bench/bench_host.py --device cuda): update
#                time, kernels launched outside the compiled graphs, Adam, batch, save; 3-5 min
#   probe        why the first steps are slow, 1-2 min
#   tests        the rest of the suite, 4+ min; each failure's traceback is written to
#                OUTDIR/failures.log as it happens; PYTEST_FILES="tests/a.py" runs only those
#   cpudecode    one CPU-trained checkpoint decoded on the GPU against its CPU output, 1 min
#   gpudecode    beam-5 decoding speed: the search on the device (with and without its static
#                cache and compiled, CUDA-graphed decoder step) against the batch-shrinking
#                search and HF generate, small and base models, bf16 and fp32, 5-8 min
#   trainshapes  the shipped En->De config in fixed batch shapes, compiled per shape, 3 min
#   trainpack    the same with packed blocks (train.pack_width=128: one shape), compiled, 3 min
#   benchgraphs  training throughput in bucketed shapes, mt compiled with CUDA graphs, against the
#                eager references and nn.Transformer compiled, bf16, vocabulary 32k, 3 min a run;
#                BENCH_SIZES="base big" BENCH_TOKENS="32768 131072" for the four runs
#   bench        training throughput (base and small) and decoding speed, 5 min; benchbase: the
#                base model's training throughput alone, 3 min, mt as `mt train` chooses
#                (train.fast_paths auto: no mt/fast on a GPU); benchref: mt without mt/fast;
#                benchfast: mt with mt/fast forced on
#   train        the shipped En->De config for TRAIN_SECONDS (3 min by default; the whole run
#                takes about 20 min on an H200)
# Logged to OUTDIR/check.log.
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in  # usage: the header above, and nothing started, installed or written
-h | --help | "")
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit "$([ -n "${1:-}" ] && echo 0 || echo 2)"
    ;;
-*)
    case "$1" in --prepare | --dry-run) ;; *)
        echo "scripts/gpu_check.sh: unknown option $1 (see --help)" >&2
        exit 2
        ;;
    esac
    ;;
esac

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
    # the decode part needs a CPU-trained run with its CPU test translation; without one the
    # other parts still run
    run=${EN_DE_RUN:-runs/en_de_drop02}
    if [ -f "$run/best.pt" ] && [ -f "$run/test.hyp.de" ]; then
        cp "$run/best.pt" "$run/config.yaml" .gpu/en_de/
        cp "$run/test.hyp.de" .gpu/en_de/cpu.test.hyp.de
    else
        echo "no $run/best.pt with test.hyp.de: the decode part will have nothing to decode (set EN_DE_RUN)"
    fi
    du -sh .gpu
    exit 0
fi
dry=""
if [ "${1:-}" = "--dry-run" ]; then dry=--dry-run; shift; fi
out=${1:?usage: scripts/gpu_check.sh [--dry-run] OUTDIR [PART ...]}
shift
parts=${*:-mfu m30k}
case "$parts" in  # the fifteen-minute sequence's calls (docs/gpu.md), by name
first) parts="job decode" ;;  # at most 9 minutes on a fresh machine, installs included
second) parts="cudatests" ;;  # under 4 minutes, right after the first on the same machine
esac
# budget SECONDS: a part's own time budget, times GPU_CHECK_SCALE (the CPU dry run's scale)
budget() { awk -v s="$1" -v k="${GPU_CHECK_SCALE:-1}" 'BEGIN { v = int(s * k + 0.5); print (v < 1 ? 1 : v) }'; }
mkdir -p "$out"
log=$out/check.log
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MT_TEST_FAILURE_LOG=$out/failures.log
exec > >(tee -a "$log") 2>&1
step() { echo; echo "=== $(date +%T) $*"; }

# timed_train NAME KEY=VALUE...: the shipped En->De config with these overrides for TRAIN_SECONDS
# (150 by default) in runs/gpu_NAME, then its start-up lines and target tokens/s by step.
# Time-boxed on purpose: SIGINT makes mt train save last.pt and exit 130 (timeout: 124).
timed_train() {
    local name=$1; shift
    timeout -s INT "${TRAIN_SECONDS:-150}" mt train configs/multi30k_en_de.yaml \
        --run-dir "runs/gpu_$name" --set "$@" > "$out/train_$name.log" 2>&1 || true
    grep -E "shapes|packed|updates|error" "$out/train_$name.log" | head -5
    python3 - "runs/gpu_$name/train_log.jsonl" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
print("target tokens/s by step:", [(r["step"], round(r["tok_s"])) for r in recs if "tok_s" in r])
EOF
}

if [ -z "$dry" ]; then
step setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .gpu/whl/*.whl || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
mkdir -p ../shared/data && [ -e ../shared/data/multi30k ] || ln -s "$PWD/.gpu/m30k" ../shared/data/multi30k
[ -f data/multi30k/train.de ] || mt download multi30k --from-dir .gpu/m30k --out data/multi30k
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
fi

failed=0  # a part that fails leaves the others to run; the status says it failed
run=${JOB_RUN:-runs/gpu_job}  # the run `job` trains and `decode` translates with
[ -n "$dry" ] && run=$out/job_run  # (OUT/run: what the job keeps of it)
for part in $parts; do case $part in
mfu)
    step "the base model on packed blocks, compiled, bf16: target tokens/s and MFU"
    timeout "${MFU_SECONDS:-150}" python3 scripts/bench/gpu_figures.py "$out" mfu $dry || failed=1
    ;;
m30k)
    step "the shipped En->De config, packed and compiled: updates/s and the whole run's forecast"
    timeout "${M30K_SECONDS:-120}" python3 scripts/bench/gpu_figures.py "$out" m30k \
        --data-dir data/multi30k $dry || failed=1
    ;;
job)
    step "the user's job: the shipped En->De config trained with the defaults, translated, scored"
    # its own budget inside (each phase's line written as it ends); the timeout is a backstop
    seconds=$(budget "${JOB_SECONDS:-340}")
    timeout "$((seconds + 20))" python3 scripts/bench/gpu_job.py "$out" job --run "$run" \
        --seconds "$seconds" $dry || failed=1
    ;;
decode)
    step "decoding the test split: eager against the compiled step, greedy and beam 5"
    seconds=$(budget "${DECODE_SECONDS:-120}")
    timeout "$((seconds + 20))" python3 scripts/bench/gpu_job.py "$out" decode --run "$run" \
        --seconds "$seconds" $dry || failed=1
    ;;
ablate)
    step "which cut pays: each variant of the base model's step, timed"
    timeout "${ABLATE_SECONDS:-500}" python3 scripts/bench/gpu_ablate.py "$out" --model base \
        --data-dir data/multi30k $dry || failed=1
    ;;
ablatem30k)
    step "which cut pays: each variant of the Multi30k config's update, timed"
    timeout "${ABLATE_SECONDS:-300}" python3 scripts/bench/gpu_ablate.py "$out" --model m30k \
        --data-dir data/multi30k $dry || failed=1
    ;;
profile)
    step "where an update's time goes: the base model's and the Multi30k config's, profiled"
    timeout "${PROFILE_SECONDS:-180}" python3 scripts/bench/gpu_profile.py "$out" \
        --data-dir data/multi30k $dry || failed=1
    ;;
cudatests)
    step "tests/test_cuda.py (the paths only a GPU takes), alone"
    seconds=$(budget "${CUDATEST_SECONDS:-150}")
    # (on a CPU, the dry run: every test skips, each import resolved)
    workers=4 && [ -n "$dry" ] && workers=0
    # (-v: each result named as it happens, so a part cut at its limit still says which ran)
    timeout "$seconds" python3 -m pytest -v -n "$workers" -p no:cacheprovider -rf \
        tests/test_cuda.py > "$out/pytest_cuda.log" 2>&1 || failed=1
    grep -E " (PASSED|FAILED|ERROR|SKIPPED) |passed|failed" "$out/pytest_cuda.log" | tail -30
    ;;
esac; done
[ -n "$dry" ] && { step done; exit "$failed"; }

for part in $parts; do case $part in
mfu|m30k|job|decode|profile|ablate|ablatem30k|cudatests) ;;  # above
probe)
    step "why the first steps are slow: the first sight of a batch shape against the second"
    timeout "${PROBE_SECONDS:-100}" python3 scripts/bench/gpu_shape_probe.py --size tiny
    ;;
pairs)
    step "several pairs against one each: ${PAIRS_STEPS:-6000} batches a direction, sizes ${PAIRS_SET:-of the bilingual recipe}"
    PAIRS_JOBS=2 timeout "${PAIRS_SECONDS:-540}" bash scripts/pairs_compare.sh runs/gpu_pairs \
        "${PAIRS_STEPS:-6000}" data/multi30k > "$out/pairs.md" || failed=1
    cat "$out/pairs.md"
    for log in runs/gpu_pairs/*.log; do grep -E "parameters|packed|compil|error" "$log" | head -4; done
    ;;
tests)
    step "the test suite on the GPU, alone"
    # -v: each result is named as it happens, so a run cut by the time limit still says which
    # tests failed (a -q log cut by the time limit ends with unnamed F's)
    timeout "${PYTEST_SECONDS:-240}" python3 -m pytest -v -n 12 -p no:cacheprovider -rf \
        ${PYTEST_FILES:---ignore tests/test_cuda.py} > "$out/pytest.log" 2>&1
    grep -c " PASSED " "$out/pytest.log"
    grep -E " (FAILED|ERROR) |^(FAILED|ERROR) |passed|failed" "$out/pytest.log" | tail -40
    ;;
cpudecode)
    step "one CPU-trained checkpoint decoded on the GPU (auto precision, then fp32)"
    for prec in auto fp32; do
        t0=$(date +%s.%N)
        timeout 60 mt translate .gpu/en_de/best.pt -i data/multi30k/test.en \
            -o "$out/gpu_$prec.hyp.de" --device cuda --precision "$prec" --force
        echo "decode $prec: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s, whole command"
        mt eval --hyp "$out/gpu_$prec.hyp.de" --ref data/multi30k/test.de --lc-tok de
        python3 - "$out/gpu_$prec.hyp.de" .gpu/en_de/cpu.test.hyp.de <<'EOF'
import sys
a, b = (open(p).read().splitlines() for p in sys.argv[1:])
print(f"lines identical to the CPU translation: {sum(x == y for x, y in zip(a, b))} of {len(b)}")
EOF
    done
    ;;
bench|benchbase)
    step "training throughput, bf16"
    timeout "${BENCH_SECONDS:-200}" python3 scripts/bench/bench_train.py --device cuda --precision bf16 --size base \
        --max-tokens 32768 --repeats 1
    [ "$part" = bench ] || continue
    timeout 120 python3 scripts/bench/bench_train.py --device cuda --precision bf16 --size small \
        --max-tokens 32768 --repeats 1
    step "beam-5 decoding speed, bf16"
    timeout 80 python3 scripts/bench/bench_decode.py --data-dir data/multi30k --device cuda \
        --precision bf16 --skip-nocache
    ;;
host)
    step "the host's work per update on the GPU: time, launches outside the compiled graphs, Adam, the batch, the save (compiled with Inductor and CUDA graphs)"
    timeout "${HOST_SECONDS:-280}" python3 scripts/bench/bench_host.py --device cuda \
        --compile inductor --base none --rounds 1 | tee "$out/host.txt"
    ;;
trainshapes)
    step "GPU step: the shipped En->De config in fixed batch shapes (train.shape_buckets=16), compiled once per shape, for ${TRAIN_SECONDS:-150} s"
    timed_train shapes train.shape_buckets=16 train.compile=true
    ;;
gpudecode)
    step "GPU decoding: beam 5 on the 1,000 test sentences, the search on the device (and its CUDA-graphed step) against the batch-shrinking one and HF generate (CTranslate2's GPU build needs CUDA 12's cuBLAS, which this machine lacks)"
    for size in small base; do for prec in bf16 fp32; do
        timeout "${DECODE_SECONDS:-120}" python3 scripts/bench/bench_decode.py --data-dir data/multi30k \
            --device cuda --precision "$prec" --size "$size" --repeats 1 --skip-nocache --json
    done; done
    ;;
trainpack)
    step "GPU step: the shipped En->De config in packed blocks (train.pack_width=128, one shape), compiled, for ${TRAIN_SECONDS:-150} s"
    timed_train pack train.pack_width=128 train.compile=true
    ;;
benchgraphs)
    step "GPU step: training throughput in bucketed shapes (multiples of 16), mt compiled and CUDA-graphed as train.compile makes it, against the eager references and nn.Transformer compiled; bf16, vocabulary 32k; sizes ${BENCH_SIZES:-base}, tokens per batch ${BENCH_TOKENS:-32768}"
    for size in ${BENCH_SIZES:-base}; do for tokens in ${BENCH_TOKENS:-32768}; do
        timeout "${BENCH_SECONDS:-200}" python3 scripts/bench/bench_train.py --device cuda \
            --precision bf16 --size "$size" --vocab 32000 --max-tokens "$tokens" \
            --shape-buckets 16 --compile --compile-reference --repeats 1
    done; done
    ;;
benchref)
    step "training throughput, bf16, base, mt without its CPU fast paths"
    timeout "${BENCH_SECONDS:-200}" python3 scripts/bench/bench_train.py --device cuda --precision bf16 \
        --size base --max-tokens 32768 --repeats 1 --no-fast-paths
    ;;
benchfast)
    step "training throughput, bf16, base, mt with its CPU fast paths forced on"
    timeout "${BENCH_SECONDS:-200}" python3 scripts/bench/bench_train.py --device cuda --precision bf16 \
        --size base --max-tokens 32768 --repeats 1 --fast-paths
    ;;
train)
    step "the shipped En->De config on the GPU, alone, for ${TRAIN_SECONDS:-180} s"
    # time-boxed on purpose: SIGINT makes mt train save last.pt and exit 130 (timeout: 124)
    timeout -s INT "${TRAIN_SECONDS:-180}" mt train configs/multi30k_en_de.yaml \
        --run-dir runs/gpu_en_de > "$out/train_en_de.log" 2>&1 || true
    cp runs/gpu_en_de/train_log.jsonl "$out/"
    python3 - "$out/train_log.jsonl" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
print("valid BLEU by step:", [(r["step"], r["valid_bleu"]) for r in recs if "valid_bleu" in r])
print("target tokens/s by step:", [(r["step"], round(r["tok_s"])) for r in recs if "tok_s" in r])
EOF
    ;;
*) echo "unknown part $part (mfu m30k job decode profile ablate ablatem30k probe pairs cudatests tests cpudecode gpudecode trainshapes trainpack benchgraphs bench benchbase benchref benchfast train)"; exit 2 ;;
esac; done
step done
exit "$failed"
