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
EVENTS = ["recompiles", "cudagraph_skips"]
KEYS = {
    "job": {
        "setup": ["phase", "seconds"],
        "compile": ["phase", "seconds", "graphs", *EVENTS],
        "training": [
            "phase", "seconds", "updates", "updates_s", "steady_updates", "budget_minutes",
            "stopped", "wall_seconds",
        ],
        "validations": ["phase", "count", "seconds", "first_seconds", "best_valid_bleu"],
        "end_of_run": ["phase", "seconds"],
        "kept": ["phase", "files"],
        "translation": ["phase", "seconds", "sentences", "beam"],
        "scoring": ["phase", "seconds", "bleu", "bleu_lc_tok", "bleu_signature"],
        "total": [
            "phase", "seconds", "budget_seconds", "train_translate_score_seconds", "device",
            "torch",
        ],
    },
    "decode": {
        "decode": [
            "phase", "beam", "sentences", "eager_s", "compiled_first_s", "compiled_second_s",
            "warm_process_first_s", "graphs", "same_outputs", "eager_sent_s",
            "compiled_sent_s", "device", *EVENTS,
        ],
    },
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, help="the folder each part's PART.json is written to")
    ap.add_argument("part", choices=[*KEYS, "warm"], help="warm: decode's second process")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data/multi30k")
    ap.add_argument("--run", type=Path, default=ROOT / "runs/gpu_job")
    ap.add_argument("--beam", type=int, default=5, help="warm: the beam")
    ap.add_argument(
        "--seconds", type=float, default=480.0, help="the part's own time budget (job, decode)"
    )
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, aot_eager")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run and args.part == "job":
        args.data_dir = Path(tempfile.mkdtemp(prefix="gpu_job_data_"))
        write_synthetic_multi30k(args.data_dir)
    if args.part == "job":
        job(args.out, args.data_dir, args.run, args.dry_run, args.seconds)
    elif args.part == "decode":
        decode(args.out, args.data_dir, args.run, args.dry_run, args.seconds)
    else:
        print(json.dumps({"first_s": first_compiled_call(args, args.beam)}), flush=True)


# -- job: the whole user's job, phase by phase -------------------------------------------------
def job(out: Path, data_dir: Path, run: Path, dry_run: bool, seconds: float) -> None:
    """The job's phases, each line written as its phase ends, within `seconds` in all: the
    training gets the budget less RESERVE (a quarter of a smaller budget) as train.max_minutes,
    so that it ends as a finished run, and is stopped (SIGINT: it saves last.pt) should it run
    past half the reserve."""
    path = out / "job.json"
    path.unlink(missing_ok=True)
    clock = Clock(seconds)
    reserve = min(RESERVE, seconds / 4)
    train_minutes = max(clock.left() - reserve, 1.0) / 60
    sets = [f"data.dir={data_dir}", f"train.max_minutes={train_minutes:.3f}"]
    sets += [*DRY_SET, "train.device=cpu"] if dry_run else []
    cmd = ["mt", "train", str(CONFIG), "--run-dir", str(run), "--restart", "--set", *sets]
    training = Training(cmd, out / "job_train.log", path)
    training.watch(stop_at=clock.left() - reserve / 2)
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    for line in training_phases(records, training, train_minutes):
        write_line(path, line)
    write_line(path, {"phase": "kept", "files": keep_run(run, out / "run")})
    translate_score_s = translate_and_score(out, data_dir, run, dry_run, clock)
    import torch

    write_line(
        path,
        {
            "phase": "total",
            "seconds": round(clock.spent(), 1),
            "budget_seconds": seconds,
            "train_translate_score_seconds": round(training.seconds + translate_score_s, 1),
            "device": "cpu" if dry_run else torch.cuda.get_device_name(0),
            "torch": torch.__version__,
        },
    )


def translate_and_score(out: Path, data_dir: Path, run: Path, dry_run: bool, clock) -> float:
    """`mt translate` of the test split with beam 5, then `mt eval --lc-tok de`, each phase's
    line written as it ends, within the part's clock; their seconds together."""
    path = out / "job.json"
    hyp = out / "test.hyp.de"
    device = ["--device", "cpu"] if dry_run else []
    translate = ["mt", "translate", str(run), "-i", str(data_dir / "test.en"), "-o", str(hyp)]
    translate_s = clock.run(
        [*translate, "--beam", "5", "--force", *device], out / "job_translate.log"
    )
    sentences = len(hyp.read_text(encoding="utf-8").splitlines())
    write_line(
        path, {"phase": "translation", "seconds": translate_s, "sentences": sentences, "beam": 5}
    )
    score = ["mt", "eval", "--hyp", str(hyp), "--ref", str(data_dir / "test.de"), "--lc-tok", "de"]
    score_s = clock.run([*score, "--json"], out / "job_eval.log")
    scores = json.loads((out / "job_eval.log").read_text())
    write_line(
        path,
        {
            "phase": "scoring",
            "seconds": score_s,
            "bleu": scores["bleu"],
            "bleu_lc_tok": scores["bleu_lc_tok"],
            "bleu_signature": scores["bleu_signature"],
        },
    )
    return translate_s + score_s


# The part's seconds kept back from the training for what follows it: the end of the run's
# averaging and tuning (inside mt train's budget), translation and scoring.
RESERVE = 90.0


class Clock:
    """A part's own time budget: what is left of it, and commands run within it."""

    def __init__(self, seconds: float):
        self.began, self.seconds = time.perf_counter(), seconds

    def spent(self) -> float:
        return time.perf_counter() - self.began

    def left(self) -> float:
        return self.seconds - self.spent()

    def run(self, cmd: list[str], log: Path) -> float:
        """Run `cmd` (stdout to `log`, stderr to log.err) within what is left; its seconds.
        Past the budget, or failing: the part ends, saying which and where to look."""
        t0 = time.perf_counter()
        try:
            with open(log, "w") as f, open(f"{log}.err", "w") as err:
                proc = subprocess.run(cmd, stdout=f, stderr=err, cwd=ROOT, timeout=self.left())
        except (subprocess.TimeoutExpired, ValueError):  # (ValueError: no time left at all)
            sys.exit(f"{' '.join(cmd[:2])}: the part's {self.seconds:g} s ran out; see {log}")
        if proc.returncode:
            sys.exit(f"{' '.join(cmd[:2])} failed ({proc.returncode}): see {log}.err")
        return round(time.perf_counter() - t0, 1)


class Training:
    """mt train run as a child, its output (progress bars' carriage returns as line ends)
    written to `log` with each line's seconds, torch's recompile and CUDA-graph logs on; the
    setup's phase line written to `path` the moment the model is built."""

    def __init__(self, cmd: list[str], log: Path, path: Path):
        from harness import TORCH_LOGS

        self.cmd, self.log, self.path = cmd, log, path
        self.env = {**os.environ, "TORCH_LOGS": TORCH_LOGS}
        self.lines: list[tuple[float, str]] = []
        self.stopped = ""  # why it ended early: "" (it ended by itself) or "budget"
        self.seconds = 0.0

    def watch(self, stop_at: float) -> None:
        """Run it to its end; SIGINT it once `stop_at` seconds have passed (a watchdog
        thread: a child that prints nothing is stopped too)."""
        import signal
        import threading

        began = time.perf_counter()
        proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env
        )

        def stop() -> None:
            if proc.poll() is None:
                self.stopped = "budget"
                proc.send_signal(signal.SIGINT)

        watchdog = threading.Timer(max(stop_at, 0.0), stop)
        watchdog.start()
        try:
            with open(self.log, "w", encoding="utf-8") as f:
                assert proc.stdout is not None
                for raw in iter(proc.stdout.readline, b""):
                    for text in raw.decode("utf-8", "replace").replace("\r", "\n").splitlines():
                        self._line(f, time.perf_counter() - began, text)
        finally:
            watchdog.cancel()
        self.seconds = time.perf_counter() - began
        if proc.wait() and not (self.stopped and proc.returncode == 130):
            sys.exit(f"{' '.join(self.cmd[:3])} failed ({proc.returncode}): see {self.log}")

    def _line(self, f, at: float, text: str) -> None:
        if not text.strip():
            return
        if "parameters on " in text and not self.lines_with("parameters on "):
            write_line(self.path, {"phase": "setup", "seconds": round(at, 1)})
        self.lines.append((at, text))
        f.write(f"{at:8.1f} {text}\n")
        f.flush()

    def lines_with(self, marker: str) -> list[float]:
        return [t for t, text in self.lines if marker in text]


def training_phases(records: list[dict], training: Training, budget_minutes: float) -> list:
    """The compile, training, validation and end-of-run phase lines, from the run's own log
    rows (each window's training seconds, validations left out, and the graphs it compiled)
    and the times its lines came."""
    from harness import compile_events_in

    windows = log_windows(records)
    per_update, steady, compile_s = steady_rate(windows)
    valid = [r for r in records if "valid_seconds" in r]  # (the end's average: no seconds)
    made = training.lines_with("parameters on ")
    last_valid = max(training.lines_with(": valid loss"), default=training.seconds)
    compile_line = {
        "phase": "compile",
        "seconds": round(compile_s, 1),
        "graphs": sum(row.get("compiles", 0) for _, row in windows),
        **compile_events_in(training.log.read_text(encoding="utf-8")),
    }
    training_line = {
        "phase": "training",
        "seconds": round(sum(row["seconds"] for _, row in windows), 1),
        "updates": max((row["step"] for _, row in windows), default=0),
        "updates_s": round(1 / per_update, 2) if per_update else None,
        "steady_updates": steady,
        "budget_minutes": round(budget_minutes, 2),
        "stopped": training.stopped or "end",
        "wall_seconds": round(last_valid - (made[0] if made else 0.0), 1),
    }
    validations = {
        "phase": "validations",
        "count": len(valid),
        "seconds": round(sum(r["valid_seconds"] for r in valid), 1),
        "first_seconds": valid[0]["valid_seconds"] if valid else None,
        "best_valid_bleu": max((r["valid_bleu"] for r in valid), default=None),
    }
    end_of_run = {"phase": "end_of_run", "seconds": round(training.seconds - last_valid, 1)}
    return [compile_line, training_line, validations, end_of_run]


def log_windows(records: list[dict]) -> list[tuple[int, dict]]:
    """(the updates, the row) of each log line's window, in order."""
    rows = [r for r in records if "seconds" in r and "tokens" in r]
    steps = [0] + [r["step"] for r in rows]
    return [(steps[i + 1] - steps[i], row) for i, row in enumerate(rows)]


def steady_rate(windows: list[tuple[int, dict]]) -> tuple[float, int, float]:
    """(seconds per update at the steady rate: over the windows without a compile; the
    updates it was measured on; the compiles' seconds: what the windows with a compile took
    beyond that rate). Where every window compiled: their mean, and no compile time."""
    steady = [(n, row) for n, row in windows if not row.get("compiles")]
    counted = steady or windows
    updates = sum(n for n, _ in counted)
    per_update = sum(row["seconds"] for _, row in counted) / updates if updates else 0.0
    compiled = [(n, row) for n, row in windows if row.get("compiles")] if steady else []
    compile_s = sum(max(row["seconds"] - n * per_update, 0.0) for n, row in compiled)
    return per_update, sum(n for n, _ in steady), compile_s


def keep_run(run: Path, kept: Path) -> list[str]:
    """The run's best.pt (its last.pt where it has none), train_log.jsonl and config.yaml
    copied into `kept`, the part's output: a later call decodes with them (JOB_RUN=) without
    training again. The names copied."""
    import shutil

    kept.mkdir(parents=True, exist_ok=True)
    names = ["best.pt" if (run / "best.pt").is_file() else "last.pt"]
    names += ["train_log.jsonl", "config.yaml"]
    for name in names:
        if (run / name).is_file() and not (kept / name).exists():
            shutil.copy2(run / name, kept / name)
    return sorted(n for n in names if (kept / n).is_file())


# -- decode: eager against compiled, the compile's cost and its cache ---------------------------
def decode(out: Path, data_dir: Path, run: Path, dry_run: bool, seconds: float) -> None:
    """A line a beam (greedy, then 5) as each ends, within `seconds`: a beam that would start
    with less time left than the last one took is not started."""
    import torch
    from harness import CompileEvents
    from torch._dynamo.utils import counters

    clock = Clock(seconds)
    path = out / "decode.json"
    path.unlink(missing_ok=True)
    # a cold compile (what a first run pays) in a cache of its own, which the second process
    # then finds warm (it inherits the variable)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_decode_")
    lines = test_lines(data_dir, dry_run)
    eager, compiled = translators(run, dry_run)
    eager.translate(lines[:8])  # the GPU's libraries set up, for either side
    events, took = CompileEvents(), 0.0  # (each recompile's reason also printed, on stderr)
    for beam in (1, 5):
        if clock.left() < took:
            print(f"decode: {clock.left():.0f} s left of {seconds:g}: beam {beam} not started")
            return
        t0, before = clock.spent(), (counters["stats"]["unique_graphs"], events.counts())
        eager_s, want = timed(lambda b=beam: eager.translate(lines, beam=b))
        first_s, got = timed(lambda b=beam: compiled.translate(lines, beam=b))
        second_s, _ = timed(lambda b=beam: compiled.translate(lines, beam=b))
        warm_s = warm_process(out, data_dir, run, beam, dry_run, clock)
        after = events.counts()
        write_line(
            path,
            {
                "phase": "decode",
                "beam": beam,
                "sentences": len(lines),
                "eager_s": round(eager_s, 2),
                "compiled_first_s": round(first_s, 2),
                "compiled_second_s": round(second_s, 2),
                "warm_process_first_s": warm_s,
                "graphs": counters["stats"]["unique_graphs"] - before[0],
                "same_outputs": sum(a == b for a, b in zip(got, want, strict=True)),
                "eager_sent_s": round(len(lines) / eager_s, 1),
                "compiled_sent_s": round(len(lines) / second_s, 1),
                "device": "cpu" if dry_run else torch.cuda.get_device_name(0),
                **{k: after[k] - before[1][k] for k in EVENTS},
            },
        )
        took = clock.spent() - t0


def warm_process(out: Path, data_dir: Path, run: Path, beam: int, dry_run: bool, clock: Clock):
    """The first compiled call's seconds in a second process (the warm Inductor cache), or
    None where it failed or ran out of the part's time."""
    cmd = [sys.executable, __file__, str(out), "warm", "--data-dir", str(data_dir)]
    cmd += ["--run", str(run), "--beam", str(beam), *(["--dry-run"] if dry_run else [])]
    try:
        warm = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=clock.left())
    except (subprocess.TimeoutExpired, ValueError):
        return None
    sys.stderr.write(warm.stderr[-3000:])
    return json.loads(warm.stdout.splitlines()[-1])["first_s"] if not warm.returncode else None


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
