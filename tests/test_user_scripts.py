"""The user-facing scripts (scripts/reproduce_multi30k.sh, which scripts/main_job.sh runs),
driven with a scripted fake `mt` on PATH: they stop at the first failure or interrupt, and an
earlier run's results are never replaced without saying so."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FAKE_MT = r"""#!/usr/bin/env bash
# records each call; FAKE_TRAIN_EXIT is train's exit status, FAKE_BLEU the score eval prints
echo "$*" >> "$FAKE_LOG"
case "$1" in
  train)
    while [ $# -gt 0 ]; do [ "$1" = --run-dir ] && mkdir -p "$2"; shift; done
    exit "${FAKE_TRAIN_EXIT:-0}" ;;
  translate)
    while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
    echo "new translation" > "$out" ;;
  eval) echo "BLEU = $FAKE_BLEU  (nrefs:1|case:mixed)"; echo "chrF = 50.00" ;;
esac
"""


def _run_script(tmp_path: Path, train_exit: int, bleu: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mt").write_text(FAKE_MT)
    (bin_dir / "mt").chmod(0o755)
    data = tmp_path / "data/multi30k"
    data.mkdir(parents=True, exist_ok=True)
    for name in ("train.de", "test.de", "test.en"):
        (data / name).write_text("x\n")
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PAIRS="de_en",
        FAKE_LOG=str(tmp_path / "calls"),
        FAKE_TRAIN_EXIT=str(train_exit),
        FAKE_BLEU=bleu,
    )
    return subprocess.run(
        ["bash", str(ROOT / "scripts/reproduce_multi30k.sh"), str(tmp_path / "no-raw")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _earlier_results(tmp_path: Path) -> Path:
    run = tmp_path / "runs/multi30k_de_en"
    run.mkdir(parents=True)
    (run / "test.hyp.en").write_text("earlier translation\n")
    (run / "test.scores").write_text("BLEU = 40.10  (nrefs:1|case:mixed)\n")
    return run


def _calls(tmp_path: Path) -> list[str]:
    return [line.split()[0] for line in (tmp_path / "calls").read_text().splitlines()]


def test_an_interrupted_training_stops_the_script_and_keeps_the_results(tmp_path):
    run = _earlier_results(tmp_path)
    proc = _run_script(tmp_path, train_exit=130, bleu="0.01")
    assert proc.returncode == 130, proc.stderr
    assert _calls(tmp_path) == ["train"]  # nothing translated or scored after the interrupt
    assert (run / "test.hyp.en").read_text() == "earlier translation\n"
    assert (run / "test.scores").read_text().startswith("BLEU = 40.10")
    assert not list(run.glob("*.prev")) and not list(run.glob("*.new"))


def test_a_lower_score_is_said_and_the_earlier_results_are_kept(tmp_path):
    run = _earlier_results(tmp_path)
    proc = _run_script(tmp_path, train_exit=0, bleu="35.20")
    assert proc.returncode == 0, proc.stderr
    assert _calls(tmp_path) == ["train", "translate", "eval"]
    assert "35.20 is lower than the earlier 40.10" in proc.stdout
    assert (run / "test.scores.prev").read_text().startswith("BLEU = 40.10")
    assert (run / "test.hyp.en.prev").read_text() == "earlier translation\n"
    assert (run / "test.scores").read_text().startswith("BLEU = 35.20")
    assert (run / "test.hyp.en").read_text() == "new translation\n"


def test_a_better_score_replaces_the_results_without_a_note(tmp_path):
    run = _earlier_results(tmp_path)
    proc = _run_script(tmp_path, train_exit=0, bleu="41.00")
    assert proc.returncode == 0 and "lower" not in proc.stdout, proc.stdout
    assert (run / "test.scores").read_text().startswith("BLEU = 41.00")
    assert "== de -> en" in proc.stdout


def test_a_first_run_writes_its_results(tmp_path):
    proc = _run_script(tmp_path, train_exit=0, bleu="38.00")
    run = tmp_path / "runs/multi30k_de_en"
    assert proc.returncode == 0, proc.stderr
    assert (run / "test.scores").read_text().startswith("BLEU = 38.00")
    assert not list(run.glob("*.prev"))
