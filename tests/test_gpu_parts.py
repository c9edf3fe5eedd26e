"""The GPU check's parts, checked on the CPU: what they read from a run's log, how they keep
their own time budget, and what they count of torch.compile's work."""

import json
import sys
import time

import pytest

from tests.test_bench_scripts import _load


@pytest.fixture(scope="module")
def gpu_job():
    return _load("gpu_job")


def test_the_steady_rate_leaves_the_compiling_windows_out(gpu_job):
    """From a run's own log rows: the steady seconds per update over the windows without a
    compile, and the compile's seconds what a compiling window took beyond that rate; the
    validation rows (no `seconds` of training) are not windows."""
    records = [
        {"step": 100, "tokens": 1, "seconds": 40.0, "compiles": 2},  # 100 updates + compile
        {"step": 200, "tokens": 1, "seconds": 1.0},
        {"step": 200, "valid_loss": 3.0, "valid_seconds": 9.0},
        {"step": 300, "tokens": 1, "seconds": 1.5, "compiles": 1},  # a recompile: +0.5 s
        {"step": 500, "tokens": 1, "seconds": 2.0},
    ]
    windows = gpu_job.log_windows(records)
    assert [n for n, _ in windows] == [100, 100, 100, 200]
    per_update, steady, compile_s = gpu_job.steady_rate(windows)
    assert per_update == pytest.approx(3.0 / 300) and steady == 300
    assert compile_s == pytest.approx((40.0 - 1.0) + (1.5 - 1.0))
    # every window compiled (a short run): their mean rate, and no compile time claimed
    assert gpu_job.steady_rate(windows[:1]) == (pytest.approx(0.4), 0, 0.0)


def test_a_training_past_its_budget_is_stopped_and_its_setup_line_kept(gpu_job, tmp_path):
    """The job's watchdog SIGINTs a training that runs past its time (one that prints nothing
    meanwhile too), and a child that ends on it with 130, as mt train does, is a stop, not a
    failure; the setup line is written the moment the model's line comes."""
    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(130))\n"
        "print('1,234 parameters on cpu', flush=True)\n"
        "time.sleep(60)\n"
    )
    path = tmp_path / "job.json"
    training = gpu_job.Training([sys.executable, "-c", child], tmp_path / "train.log", path)
    t0 = time.perf_counter()
    training.watch(stop_at=2.0)
    assert training.stopped == "budget" and 2.0 <= time.perf_counter() - t0 < 30
    assert [json.loads(x)["phase"] for x in path.read_text().splitlines()] == ["setup"]
    assert "parameters on cpu" in (tmp_path / "train.log").read_text()


def test_compile_events_count_recompiles_and_a_logs_lines(tmp_path):
    """CompileEvents counts this process's recompiles from torch's own recompile log, from
    its making on; compile_events_in reads both kinds from a log written with TORCH_LOGS."""
    harness = _load("harness")
    import torch._dynamo

    torch._dynamo.reset()
    events = harness.CompileEvents()

    @torch.compile(backend="eager", dynamic=False)
    def double(x):
        return x * 2

    for n in (3, 4, 5):  # a size a guard does not accept: a recompile each after the first
        double(torch.ones(n))
    assert events.counts() == {"recompiles": 2, "cudagraph_skips": 0}
    text = (
        "V1207 [0/1] [__recompiles] Recompiling function f in x.py:9\n"
        "V1207 [0/1] [__recompiles]     triggered by the following guard failure(s):\n"
        "W1207 [__cudagraphs] skipping cudagraphs due to mutated inputs (1 instances)\n"
    )
    assert harness.compile_events_in(text) == {"recompiles": 1, "cudagraph_skips": 1}
    torch._dynamo.reset()


def test_the_torch_floor_is_the_torch_ci_tests():
    """pyproject's lowest torch is the one scripts/setup.sh installs for CI (what the suite
    runs on): a lower bound no run has checked would be a guess."""
    import re

    import tomllib

    from tests.conftest import ROOT

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.match(r"torch>=([\d.]+)", d) for d in deps if d.startswith("torch"))
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert floor is not None and f"TORCH_SPEC:-torch=={floor[1]}.0" in setup, floor
