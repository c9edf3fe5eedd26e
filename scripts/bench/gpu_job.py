"""What a user's GPU job costs, as the user runs it, one part at a time:

  job     the shipped Multi30k En->De config trained to its end with the defaults (`mt train
          configs/multi30k_en_de.yaml`: on a GPU the step compiled, packed), the test split
          translated with beam 5 (`mt translate`) and scored (`mt eval --lc-tok de`). A JSON
          line per phase as it ends: setup (data, BPE, model), the compiles and warm-up (from
          the forecast line), training (its updates/s), the validations (their seconds, the
          first apart), the end of the run (averaging, tuning), translation, scoring and BLEU.
  decode  the 1,000 test sentences decoded in one process, greedy and beam 5, eager against
          the compiled step (decode.compile_step never / always): the first compiled call with
          its compiles (Dynamo logs each recompile's reason to stderr), the second call, and a
          second process whose first call compiles from the warm Inductor cache; sentences/s,
          graphs, and how many outputs the two steps share.

    python scripts/bench/gpu_job.py OUTDIR PART [--data-dir DIR] [--run RUN] [--dry-run]

Each line goes to OUTDIR/PART.json the moment its phase ends (a call cut short keeps what
finished). decode translates with the run `job` trained (--run; default runs/gpu_job).
--dry-run: the same code on the CPU at a size that runs in seconds (the shipped config shrunk,
a synthetic corpus written as Multi30k's files, 60 updates; torch.compile's aot_eager backend):
the keys of the JSON lines, for the tests. scripts/gpu_check.sh runs both parts (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs/multi30k_en_de.yaml"
DRY_SET = [  # the shipped config at a size a CPU trains in seconds
    "model.d_model=16", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1",
    "model.d_ff=32", "tokenizer.vocab_size=120", "train.max_tokens=1024", "train.max_steps=60",
    "train.valid_every=20", "train.save_every=20", "train.log_every=20", "train.average_last=2",
]  # fmt: skip
KEYS = {
    "job": {
        "setup": ["phase", "seconds"],
        "compile": ["phase", "seconds", "updates_s"],
        "training": ["phase", "seconds", "updates", "updates_s"],
        "validations": ["phase", "count", "seconds", "first_seconds", "best_valid_bleu"],
        "end_of_run": ["phase", "seconds"],
        "translation": ["phase", "seconds", "sentences", "beam"],
        "scoring": ["phase", "seconds", "bleu", "bleu_lc_tok", "bleu_signature"],
        "total": ["phase", "seconds", "train_translate_score_seconds", "device", "torch"],
    },
    "decode": {
        "decode": [
            "phase", "beam", "sentences", "eager_s", "compiled_first_s", "compiled_second_s",
            "warm_process_first_s", "graphs", "same_outputs", "eager_sent_s",
            "compiled_sent_s", "device",
        ],
    },
}  # fmt: skip
VALID_LINE = re.compile(r"step (\d+): valid loss")
FORECAST = re.compile(r"([\d.]+) (updates/s|s per update) on this machine(?: after (\d+) s)?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, help="the folder each part's PART.json is written to")
    ap.add_argument("part", choices=[*KEYS, "warm"], help="warm: decode's second process")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data/multi30k")
    ap.add_argument("--run", type=Path, default=ROOT / "runs/gpu_job")
    ap.add_argument("--beam", type=int, default=5, help="warm: the beam")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, aot_eager")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run and args.part == "job":
        args.data_dir = Path(tempfile.mkdtemp(prefix="gpu_job_data_"))
        write_synthetic_multi30k(args.data_dir)
    if args.part == "job":
        job(args.out, args.data_dir, args.run, args.dry_run)
    elif args.part == "decode":
        decode(args.out, args.data_dir, args.run, args.dry_run)
    else:
        print(json.dumps({"first_s": first_compiled_call(args, args.beam)}), flush=True)


# -- job: the whole user's job, phase by phase -------------------------------------------------
def job(out: Path, data_dir: Path, run: Path, dry_run: bool) -> None:
    path = out / "job.json"
    path.unlink(missing_ok=True)
    began = time.perf_counter()
    sets = [f"data.dir={data_dir}", *(DRY_SET if dry_run else [])]
    if dry_run:
        sets.append("train.device=cpu")
    cmd = ["mt", "train", str(CONFIG), "--run-dir", str(run), "--restart", "--set", *sets]
    lines = timed_lines(cmd, out / "job_train.log")
    train_end = time.perf_counter() - began
    model_at = first(lines, "parameters on ")
    write_line(path, {"phase": "setup", "seconds": round(model_at, 1)})
    forecast = next((FORECAST.search(t) for _, t in lines if FORECAST.search(t)), None)
    rate = _rate(forecast)
    warm = float(forecast.group(3) or 0) if forecast else None
    write_line(path, {"phase": "compile", "seconds": warm, "updates_s": rate})
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    valid = [r for r in records if "valid_seconds" in r]  # (the end's average: no seconds)
    steps = max(r["step"] for r in records if "step" in r)
    last_valid = max((t for t, text in lines if VALID_LINE.search(text)), default=train_end)
    write_line(path, {"phase": "training", "seconds": round(last_valid - model_at, 1),
                      "updates": steps, "updates_s": rate})  # fmt: skip
    write_line(path, {
        "phase": "validations", "count": len(valid),
        "seconds": round(sum(r["valid_seconds"] for r in valid), 1),
        "first_seconds": valid[0]["valid_seconds"] if valid else None,
        "best_valid_bleu": max((r["valid_bleu"] for r in valid), default=None),
    })  # fmt: skip
    write_line(path, {"phase": "end_of_run", "seconds": round(train_end - last_valid, 1)})
    hyp = out / "test.hyp.de"
    t0 = time.perf_counter()
    device = ["--device", "cpu"] if dry_run else []
    run_ok(["mt", "translate", str(run), "-i", str(data_dir / "test.en"), "-o", str(hyp),
            "--beam", "5", "--force", *device], out / "job_translate.log")  # fmt: skip
    translate_s = time.perf_counter() - t0
    sentences = len(hyp.read_text(encoding="utf-8").splitlines())
    write_line(path, {"phase": "translation", "seconds": round(translate_s, 1),
                      "sentences": sentences, "beam": 5})  # fmt: skip
    t0 = time.perf_counter()
    scores = json.loads(run_ok(["mt", "eval", "--hyp", str(hyp), "--ref",
                                str(data_dir / "test.de"), "--lc-tok", "de", "--json"],
                               out / "job_eval.log"))  # fmt: skip
    score_s = time.perf_counter() - t0
    write_line(path, {"phase": "scoring", "seconds": round(score_s, 1), "bleu": scores["bleu"],
                      "bleu_lc_tok": scores["bleu_lc_tok"],
                      "bleu_signature": scores["bleu_signature"]})  # fmt: skip
    import torch

    write_line(path, {
        "phase": "total", "seconds": round(time.perf_counter() - began, 1),
        "train_translate_score_seconds": round(train_end + translate_s + score_s, 1),
        "device": "cpu" if dry_run else torch.cuda.get_device_name(0), "torch": torch.__version__,
    })  # fmt: skip


def _rate(forecast) -> float | None:
    if forecast is None:
        return None
    value = float(forecast.group(1))
    return round(value if forecast.group(2) == "updates/s" else 1 / value, 2)


def timed_lines(cmd: list[str], log: Path) -> list[tuple[float, str]]:
    """Run `cmd`, its output (progress bars' carriage returns as line ends) to `log`: each
    line with the seconds since the start at which it came."""
    began = time.perf_counter()
    lines: list[tuple[float, str]] = []
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            for text in raw.decode("utf-8", "replace").replace("\r", "\n").splitlines():
                if text.strip():
                    lines.append((time.perf_counter() - began, text))
                    f.write(f"{lines[-1][0]:8.1f} {text}\n")
        if proc.wait():
            sys.exit(f"{' '.join(cmd[:3])} failed ({proc.returncode}): see {log}")
    return lines


def first(lines: list[tuple[float, str]], marker: str) -> float:
    return next((t for t, text in lines if marker in text), 0.0)


def run_ok(cmd: list[str], log: Path) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:2])} failed ({proc.returncode}): see {log}")
    return proc.stdout


# -- decode: eager against compiled, the compile's cost and its cache ---------------------------
def decode(out: Path, data_dir: Path, run: Path, dry_run: bool) -> None:
    import torch
    from torch._dynamo.utils import counters

    path = out / "decode.json"
    path.unlink(missing_ok=True)
    # a cold compile (what a first run pays) in a cache of its own, which the second process
    # then finds warm (it inherits the variable)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_decode_")
    lines = test_lines(data_dir, dry_run)
    eager, compiled = translators(run, dry_run)
    eager.translate(lines[:8])  # the GPU's libraries set up, for either side
    torch._logging.set_logs(recompiles=True)  # each recompile's reason, on stderr
    for beam in (1, 5):
        graphs = counters["stats"]["unique_graphs"]
        eager_s, want = timed(lambda b=beam: eager.translate(lines, beam=b))
        first_s, got = timed(lambda b=beam: compiled.translate(lines, beam=b))
        second_s, _ = timed(lambda b=beam: compiled.translate(lines, beam=b))
        warm = subprocess.run(
            [sys.executable, __file__, str(out), "warm", "--data-dir", str(data_dir), "--run",
             str(run), "--beam", str(beam), *(["--dry-run"] if dry_run else [])],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        sys.stderr.write(warm.stderr[-3000:])
        warm_s = (
            json.loads(warm.stdout.splitlines()[-1])["first_s"] if not warm.returncode else None
        )
        write_line(path, {
            "phase": "decode", "beam": beam, "sentences": len(lines),
            "eager_s": round(eager_s, 2), "compiled_first_s": round(first_s, 2),
            "compiled_second_s": round(second_s, 2), "warm_process_first_s": warm_s,
            "graphs": counters["stats"]["unique_graphs"] - graphs,
            "same_outputs": sum(a == b for a, b in zip(got, want, strict=True)),
            "eager_sent_s": round(len(lines) / eager_s, 1),
            "compiled_sent_s": round(len(lines) / second_s, 1),
            "device": "cpu" if dry_run else torch.cuda.get_device_name(0),
        })  # fmt: skip


def first_compiled_call(args, beam: int) -> float:
    """decode's second process: the compiled step's first call, from Inductor's cache."""
    lines = test_lines(args.data_dir, args.dry_run)
    _, compiled = translators(args.run, args.dry_run)
    compiled.translate(lines[:8], beam=beam)  # (the libraries' set-up, as for the first process)
    seconds, _ = timed(lambda: compiled.translate(lines, beam=beam))
    return round(seconds, 2)


def test_lines(data_dir: Path, dry_run: bool) -> list[str]:
    if dry_run:
        from mt.data.synthetic import generate

        return generate(40, seed=2)[0]
    return (data_dir / "test.en").read_text(encoding="utf-8").splitlines()


def translators(run: Path, dry_run: bool):
    """(eager, compiled) Translators of `run` on the GPU (the CPU for a dry run), sharing the
    model; the compiled one compiles whatever the job's size (decode.compile_step always)."""
    import torch

    from mt.decode.translator import Translator

    if dry_run:  # Inductor's compile costs minutes on two cores; the graph is the same
        torch.compile = functools.partial(torch.compile, backend="aot_eager")
    eager = Translator.load(run, "cpu" if dry_run else "cuda")

    def with_step(choice: str) -> Translator:
        cfg = eager.cfg.model_copy(update={"compile_step": choice, "device_search": "always"})
        return Translator(eager.model, eager.tokenizer, cfg, eager.device, eager.amp_dtype)

    return with_step("never"), with_step("always")


def timed(work):
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = work()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, result


def write_synthetic_multi30k(folder: Path) -> None:
    from mt.data.synthetic import generate

    folder.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", 600, 0), ("valid", 40, 1), ("test", 40, 2)):
        src, tgt = generate(n, seed)
        (folder / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


def write_line(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
