"""Several models of one config trained side by side as one run (train.members): member K is
a full run of its own in RUN_DIR/memberK, with the seed train.seed + K - 1 and, on a CPU, its
share of the cores, trained by an `mt train` process of its own. So each keeps its own
checkpoints, logs, resume and Ctrl-C, and a member that fails leaves the others' files as they
were. RUN_DIR/ensemble.json names the members; every command that translates takes RUN_DIR
as their ensemble, with the decoding tuned on valid for them together at the end.

Why side by side: a small model's update uses two cores less than twice as well as one (on
the 2-core CPU of docs/multi30k_recipe.md one thread makes about 80 updates a minute, two
108-160), and once one model has converged, a second model's errors, averaged with the
first's, buy more than more updates of one (docs/multi30k_recipe.md measures it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mt.artifacts import members
from mt.config import Config
from mt.errors import MTError
from mt.train.rundir import RunLock, has_checkpoint, set_aside, trained_files

Say = Callable[[str], None]


@dataclass
class Member:
    """One member's process, and what it said (its output, also in RUN_DIR/memberK.log)."""

    name: str
    seed: int
    run_dir: Path
    proc: subprocess.Popen
    said: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None


def member_threads(cfg: Config) -> int:
    """The CPU threads of each member: train.num_threads (or MT_THREADS) if set, else an even
    share of the usable cores; 0 on a GPU (its member decides). More members than cores, or
    members under torchrun's ranks, are refused."""
    from mt.runtime.env import env_int
    from mt.runtime.threads import usable_cores

    t, n = cfg.train, cfg.train.members
    if env_int("WORLD_SIZE") > 1:
        raise MTError(
            f"train.members={n} under torchrun: each rank would start every member; train the "
            f"members with a plain mt train (side by side on this machine), or train one model "
            f"on the ranks with train.members=1"
        )
    given = t.num_threads or env_int("MT_THREADS")
    if not _on_cpu(cfg):
        return given
    cores = usable_cores()
    if n > cores:
        raise MTError(
            f"train.members={n}: this machine gives mt {cores} CPU core(s) and each member "
            f"trains on at least one; set train.members to at most {cores}, or train on a GPU"
        )
    return given or max(1, cores // n)


def _on_cpu(cfg: Config) -> bool:
    import torch

    return cfg.train.device == "cpu" or not torch.cuda.is_available()


def check_run_dir(run_dir: Path, n: int, restart: bool, say: Say) -> None:
    """RUN_DIR holds nothing, or this run of n members (resumed); --restart moves its files
    aside (into RUN_DIR/replaced-<time>/) first."""
    if restart:
        set_aside(run_dir, say)
        return
    found = members.manifest(run_dir)
    if found is None:
        if has_checkpoint(run_dir) or trained_files(run_dir):
            raise MTError(
                f"{run_dir} holds a run of one model: train the {n} members into another "
                f"--run-dir, or add --restart to start again with its files moved aside"
            )
        return
    had = len(found["members"])
    if had != n:
        raise MTError(
            f"{run_dir} holds a run of {had} members, but train.members is {n}: set "
            f"train.members={had} to resume it, or train into another --run-dir (or add "
            f"--restart to start again with its files moved aside)"
        )


def member_command(
    config: Path, overrides: list[str], run_dir: Path, seed: int, threads: int, allow: bool
) -> list[str]:
    """The `mt train` of one member: the user's config and overrides, its seed and threads."""
    sets = [*overrides, "train.members=1", f"train.seed={seed}"]
    sets += [f"train.num_threads={threads}"] if threads else []
    flags = ["--allow-config-change"] if allow else []
    return [
        sys.executable,
        "-m",
        "mt",
        "train",
        str(config),
        "--run-dir",
        str(run_dir),
        *flags,
        "--set",
        *sets,
    ]


def train_members(
    config: Path,
    overrides: list[str],
    cfg: Config,
    run_dir: Path,
    allow: bool,
    restart: bool,
    say: Say,
) -> int:
    """Train cfg.train.members members into run_dir side by side; the exit status."""
    from mt.data.prepare import ensure_data

    n, seed = cfg.train.members, cfg.train.seed
    threads = member_threads(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    try:
        check_run_dir(run_dir, n, restart, say)
        ensure_data(cfg, say)  # (once here: the members would all download it at once)
        names = [members.member_name(k + 1) for k in range(n)]
        seeds = [seed + k for k in range(n)]
        members.write_manifest(run_dir, {"members": names, "seeds": seeds})
        share = f"{threads} thread(s) each" if threads else "the device shared"
        say(f"training {n} members side by side ({share}), seeds {seeds}, into {run_dir}")
        started = [
            start_member(
                name,
                s,
                run_dir,
                member_command(config, overrides, run_dir / name, s, threads, allow),
            )
            for name, s in zip(names, seeds, strict=True)
        ]
        wait_for(started, cfg.train.max_steps, say)
        status = outcome(started, run_dir, say)
        if status == 0:
            tune_together(run_dir, cfg, say)
        return status
    finally:
        lock.release()


def start_member(name: str, seed: int, run_dir: Path, command: list[str]) -> Member:
    """Start one member in a process group of its own (a Ctrl-C at the terminal reaches
    this process alone, which passes each signal on once: see wait_for)."""
    env = dict(os.environ, TQDM_DISABLE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    return Member(name, seed, run_dir / name, proc)


def _read(member: Member, log: Path, show: Say) -> None:
    """A member's output, line by line, into RUN_DIR/memberK.log and on to the user."""
    assert member.proc.stdout is not None
    with open(log, "a", encoding="utf-8") as f:
        for line in member.proc.stdout:
            f.write(line)
            f.flush()
            if line.strip():
                member.said = [*member.said[-19:], line.rstrip()]
                show(f"[{member.name}] {line.rstrip()}")


def wait_for(started: list[Member], max_steps: int, say: Say) -> None:
    """Until every member has ended: their output shown as it comes, with a progress bar over
    their steps; SIGINT and SIGTERM passed on to each member still training (once: stop after
    this update and save; twice: at once)."""
    from tqdm import tqdm

    bar = tqdm(total=max_steps * len(started), desc="members", dynamic_ncols=True, mininterval=1)
    show = lambda line: tqdm.write(line, file=sys.stderr)  # noqa: E731
    for m in started:
        m.reader = threading.Thread(target=_read, args=(m, m.run_dir.with_suffix(".log"), show))
        m.reader.start()

    def pass_on(signum, frame):
        for m in started:
            if m.proc.poll() is None:
                m.proc.send_signal(signum)

    old = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while any(m.proc.poll() is None for m in started):
            steps = [last_step(m.run_dir) for m in started]
            bar.n = sum(steps)
            bar.set_postfix_str(
                ", ".join(f"{m.name} {s}" for m, s in zip(started, steps, strict=True))
            )
            time.sleep(0.5)
        for m in started:
            assert m.reader is not None
            m.reader.join()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        bar.close()


def last_step(run_dir: Path) -> int:
    """The step of a run's last train_log.jsonl record (0 before the first)."""
    try:
        with open(run_dir / "train_log.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


def outcome(started: list[Member], run_dir: Path, say: Say) -> int:
    """The run's exit status, with what each member that did not finish said: a failure's
    (2 where a member refused something, 1 for another failure), else a signal's (130, 143),
    else 0."""
    codes = {m.name: m.proc.returncode for m in started}
    failed = [m for m in started if codes[m.name] not in (0, 130, 143)]
    for m in failed:
        code = codes[m.name]
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        last = next((x for x in reversed(m.said) if x.strip()), "no output")
        say(f"{m.name} failed ({how}): {last} (its output: {m.run_dir.with_suffix('.log')})")
    if failed:
        others = [f"{m.name} {_ended(codes[m.name])}" for m in started if m not in failed]
        kept = f" ({', '.join(others)})" if others else ""
        say(
            f"the other members' files are as they were{kept}: fix the cause and run the "
            f"same command again to resume every member"
        )
        return 2 if any(codes[m.name] == 2 for m in failed) else 1
    stopped = [m for m in started if codes[m.name] != 0]
    if stopped:
        say(
            f"stopped: {', '.join(m.name for m in stopped)} saved last.pt; run the same "
            f"command again to resume every member of {run_dir}"
        )
        return int(stopped[0].proc.returncode)
    return 0


def _ended(code: int) -> str:
    return "finished" if code == 0 else "stopped and saved"


def tune_together(run_dir: Path, cfg: Config, say: Say) -> None:
    """decode.tune_beams: the members' ensemble tuned on the valid split (what `mt tune
    RUN_DIR` does), kept in RUN_DIR/ensemble.json for every command that decodes it."""
    from mt.evaluate.tuning import describe_settings, tune_ensemble, tuning_pairs

    d = cfg.decode
    if not d.tune_beams or cfg.model.arch == "nat":
        return
    if not all((d / "best.pt").is_file() for d in members.member_dirs(run_dir) or []):
        say("no ensemble tuning: a member has no best.pt (it never validated)")
        return
    from mt.runtime.threads import choose_threads

    choose_threads(cfg.train.num_threads, say)
    src, refs, pairs = tuning_pairs(cfg, None, None)
    rec = tune_ensemble(
        run_dir,
        src,
        refs,
        cfg.train.device,
        pairs,
        beams=d.tune_beams,
        penalties=d.tune_length_penalties,
    )
    best = rec["tuned_decoding"]
    say(
        f"the ensemble's decoding tuned on valid: {describe_settings(best)} (BLEU "
        f"{best['valid_bleu']}), kept in {run_dir / members.ENSEMBLE_FILE}"
    )
