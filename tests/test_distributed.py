"""Data-parallel training on CPU with the gloo backend."""

import os
import re
import shutil
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import mt.data.prepare
from mt.artifacts import checkpoint
from mt.config import load_config
from mt.data.batching import collate
from mt.data.download import download
from mt.errors import MTError
from mt.train.build import build_trainer
from tests.conftest import (
    EXACT_ADAM,
    ROOT,
    cli_env,
    free_port,
    join_ranks,
    out_of_memory_on_call,
    tiny_config,
)

HALVES = (list(range(24)), list(range(24, 48)))
# the reference model, as on a GPU (mt/fast's CPU paths read lengths from the device), and no
# clipping (which would hide a wrong scale of the gradients)
REFERENCE = (*EXACT_ADAM, "train.fast_paths=false", "train.clip_norm=0")


def _worker(rank, world, port, data_dir, run_dir, out, mode):
    """Three updates of rank `rank`'s half of the batch; the weights, and the host's reads of
    the device in the second and third updates with the time budget on."""
    from tqdm import tqdm

    from mt.runtime.host_syncs import HostSyncs

    join_ranks(rank, world, port)
    t = build_trainer(
        tiny_config(data_dir, *REFERENCE, f"train.data_parallel={mode}", "train.max_minutes=10",
                    "train.log_every=100"),
        run_dir, log=lambda *_: None,
    )  # fmt: skip
    t.budget.start(t.state)
    bar, reads = tqdm(disable=True), []
    for update in range(3):
        with HostSyncs() as syncs:
            assert t.train_step([collate(t.train_data, np.array(HALVES[rank]))])
            assert not t._after_update(bar)
        reads += [syncs.where] if update else []  # (the first allocates Adam's state)
    if rank == 0:
        torch.save({"model": t.model.state_dict(), "reads": reads}, out)
    t.close()
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("mode", ["flat", pytest.param("ddp", marks=pytest.mark.slow)])
def test_two_ranks_with_batch_b_equal_one_rank_with_2b(tmp_path, mode):
    """Both exchanges give one process's weights with the ranks' batches together; the flat
    one reads nothing from the device in an update (ranks and time budget on) outside the
    check steps (mt/train/trainer.py)."""
    data = tmp_path / "data"
    download("synthetic", data)
    single = build_trainer(tiny_config(data, *REFERENCE), tmp_path / "single", log=lambda *_: None)
    (tmp_path / "ddp").mkdir()
    shutil.copy(tmp_path / "single/spm.model", tmp_path / "ddp/spm.model")  # same BPE
    mp.spawn(
        _worker,
        args=(2, free_port(), data, tmp_path / "ddp", tmp_path / "ddp.pt", mode),
        nprocs=2,
        join=True,
    )
    before = {k: v.clone() for k, v in single.model.state_dict().items()}
    for _ in range(3):
        single.train_step([collate(single.train_data, np.array(HALVES[0] + HALVES[1]))])
    ranked = torch.load(tmp_path / "ddp.pt")
    moved = max(float((v - before[k]).abs().max()) for k, v in single.model.state_dict().items())
    assert moved > 1e-3
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(ranked["model"][k], v, atol=1e-6, rtol=1e-5)
    if mode == "flat":
        assert ranked["reads"] == [{}, {}]


def _why_it_failed(stderr: str) -> str:
    """The lines of a failed torchrun's stderr that say why a rank died (a C++ abort or a
    fatal Python error comes long before torchrun's own traceback), then the tail."""
    cause = [
        line
        for line in stderr.splitlines()
        if re.search(r"terminate called|what\(\)|Fatal Python error|Error:|exitcode", line)
    ]
    return "\n".join(cause[:20]) + "\n...\n" + stderr[-1500:]


def test_torchrun_two_processes_resume_equals_uninterrupted(tmp_path):
    """Two ranks, 20 updates, stop, resume to 30 == 30 updates straight: one log writer, the
    same losses and the same weights, since each rank's dropout stream is restored."""
    import json
    import subprocess
    import sys

    env = cli_env(OMP_NUM_THREADS="1")

    def train(run, steps):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            "-m",
            "mt",
            "train",
            str(ROOT / "configs/tiny.yaml"),
            "--run-dir",
            str(tmp_path / run),
            "--set",
            f"data.dir={tmp_path / 'd'}",
            "model.dropout=0.2",
            "train.log_every=10",
            "train.device=cpu",
            "train.valid_every=20",
            "train.save_every=20",
            "train.valid_beam=1",
            f"train.max_steps={steps}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, _why_it_failed(proc.stderr)
        return proc

    train("resumed", 20)
    assert "resuming from" in train("resumed", 30).stderr
    train("straight", 30)

    def losses(run):
        recs = [
            json.loads(x) for x in (tmp_path / run / "train_log.jsonl").read_text().splitlines()
        ]
        return [(r["step"], r["loss"], r["nll"]) for r in recs if "loss" in r]

    assert [step for step, *_ in losses("resumed")] == [10, 20, 30]  # one writer: rank 0
    assert losses("resumed") == losses("straight")
    a, b = (checkpoint.load(tmp_path / run / "last.pt") for run in ("resumed", "straight"))
    assert a["train_state"]["step"] == 30 and a["train_state"]["batch_in_epoch"] % 2 == 0
    assert len(a["rank_rng"]) == 2
    assert not torch.equal(a["rank_rng"][0]["torch"], a["rank_rng"][1]["torch"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def _clock_worker(rank, world, port, data_dir, run_dir, out):
    join_ranks(rank, world, port)
    from mt.train.update.schedule import budget_progress

    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [
            f"data.dir={data_dir}",
            "train.max_minutes=1",
            "train.max_steps=1000",
            "train.cooldown=1.0",
            "train.device=cpu",
        ],
    )
    t = build_trainer(cfg, run_dir, log=lambda *_: None)
    t.state.train_seconds = 6.0 + 24.0 * rank  # the ranks' clocks disagree
    signum = t.budget.agree(t.state, 15 * rank)  # and rank 1 was sent SIGTERM
    seconds = t.budget.seconds
    t.scheduler.set_progress(budget_progress(t.state.step, seconds, 1000, 1.0))
    torch.save(
        {
            "seconds": seconds,
            "lr": t.scheduler.get_last_lr()[0],
            "scale": t.scheduler.scale,
            "signal": signum,
        },
        f"{out}.{rank}",
    )
    t.close()


def test_ranks_agree_on_the_clock_that_ends_the_budget_and_cools_the_rate(tmp_path):
    """With a time budget every rank takes the slowest clock (30 s of 60 here), so the budget
    stops them together and the cool-down gives them one learning rate (half of Noam's)."""
    data = tmp_path / "data"
    download("synthetic", data)
    build_trainer(
        tiny_config(data, *EXACT_ADAM), tmp_path / "one", log=lambda *_: None
    ).close()  # trains the BPE
    (tmp_path / "ddp").mkdir()
    shutil.copy(tmp_path / "one/spm.model", tmp_path / "ddp/spm.model")
    mp.spawn(
        _clock_worker,
        args=(2, free_port(), data, tmp_path / "ddp", tmp_path / "clock"),
        nprocs=2,
        join=True,
    )
    seen = [torch.load(f"{tmp_path / 'clock'}.{rank}") for rank in (0, 1)]
    assert seen[0]["seconds"] == seen[1]["seconds"] == 30.0
    assert seen[0]["signal"] == seen[1]["signal"] == 15
    assert seen[0]["lr"] == seen[1]["lr"] > 0
    assert seen[0]["scale"] == seen[1]["scale"] == 0.5


def _slow_rank0_worker(rank, world, port, data_dir, run_dir, delay):
    join_ranks(rank, world, port)
    if rank == 0:  # downloading/BPE and validating take `delay` s
        real_ensure = mt.data.prepare.ensure_data

        def slow_ensure(*a, **k):
            time.sleep(delay)
            return real_ensure(*a, **k)

        mt.data.prepare.ensure_data = slow_ensure
    t = build_trainer(
        tiny_config(
            data_dir,
            "train.dist_timeout_minutes=0.05",  # 3 s
            "train.max_steps=4",
            "train.valid_every=2",
            "train.save_every=100",
            "train.valid_beam=1",
        ),
        run_dir,
        log=lambda *_: None,
    )
    if rank == 0:
        real_validate = t.validate

        def slow_validate():
            time.sleep(delay)
            return real_validate()

        t.validate = slow_validate
    try:
        assert t.fit().step == 4
    finally:
        t.close()


def test_rank0_solo_work_longer_than_the_collective_timeout_is_waited_for(tmp_path):
    mp.spawn(
        _slow_rank0_worker,
        args=(2, free_port(), tmp_path / "data", tmp_path / "run", 6),
        nprocs=2,
        join=True,
    )
    assert (tmp_path / "run" / "last.pt").is_file()


def _oom_worker(rank, world, port, data_dir, run_dir, out):
    join_ranks(rank, world, port)
    t = build_trainer(
        tiny_config(data_dir, "train.dist_timeout_minutes=0.5"), run_dir, log=lambda *_: None
    )
    if rank == 1:  # rank 1 runs out of memory once
        out_of_memory_on_call(t.model, 2)
    done = [
        t.train_step([collate(t.train_data, np.arange(rank * 24, rank * 24 + 24))])
        for _ in range(3)
    ]
    t.settle_skips()  # (skipped on the device, found at the host's next read)
    torch.save(
        {"done": done, "state": t.state.state_dict(), "model": t.model.state_dict()},
        out / f"rank{rank}.pt",
    )
    t.close()


def test_out_of_memory_on_one_rank_is_skipped_by_all_ranks(tmp_path):
    download("synthetic", tmp_path / "data")
    (tmp_path / "out").mkdir()
    mp.spawn(
        _oom_worker,
        args=(2, free_port(), tmp_path / "data", tmp_path / "run", tmp_path / "out"),
        nprocs=2,
        join=True,
    )
    r0, r1 = (torch.load(tmp_path / "out" / f"rank{r}.pt") for r in (0, 1))
    assert r0["done"] == r1["done"] == [True, True, True]
    assert r0["state"]["step"] == r1["state"]["step"] == 2
    assert r0["state"]["oom_skipped"] == r1["state"]["oom_skipped"] == 1
    for k, v in r0["model"].items():  # still one model
        assert torch.equal(v, r1["model"][k]), k


def test_more_ranks_on_a_machine_than_it_has_gpus_is_a_one_line_error(monkeypatch):
    """torchrun --nproc-per-node 2 on a one-GPU machine: every rank says why before it joins
    the group (torch.cuda.set_device would stop only the second, with "invalid device
    ordinal")."""
    from mt.runtime import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        distributed.dist, "init_process_group", lambda *a, **k: pytest.fail("joined the group")
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for rank in ("0", "1"):  # every rank says it, not only the one left over
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        with pytest.raises(
            MTError,
            match=r"started 2 processes on this machine, which has 1 "
            r"GPU: use --nproc-per-node 1",
        ):
            distributed.setup("auto")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # launched without it: the extra rank still says
    with pytest.raises(MTError, match="started 2 processes"):
        distributed.setup("auto")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # enough GPUs: it goes on
    with pytest.raises(pytest.fail.Exception, match="joined the group"):
        distributed.setup("auto")


def _torchrun(tmp_path, run, cache, *how, steps=6):
    """`mt train` of configs/tiny.yaml under torchrun with `how` (its own flags, then more
    KEY=VALUE settings), the token cache on and in `cache`: the started process."""
    import subprocess
    import sys

    env = cli_env(OMP_NUM_THREADS="1", MT_CACHE_DIR=str(cache))
    flags = [x for x in how if "=" not in x or x.startswith("--")]
    sets = [x for x in how if "=" in x and not x.startswith("--")]
    cmd = [sys.executable, "-m", "torch.distributed.run", *flags, "-m", "mt", "train",
           str(ROOT / "configs/tiny.yaml"), "--run-dir", str(tmp_path / run), "--set",
           f"data.dir={tmp_path / 'd'}", "data.token_cache=true", "train.device=cpu",
           "train.valid_every=1000", f"train.max_steps={steps}", *sets]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_two_machines_each_write_their_own_token_cache_and_train_as_one(tmp_path):
    """Two torchrun invocations joined through one rendezvous, as on two machines, each with
    its own cache folder (MT_CACHE_DIR): the first rank of each machine writes that machine's
    token cache, and the two ranks train exactly as two ranks of one machine do."""
    download("synthetic", tmp_path / "d")
    port = free_port()
    machines = [
        _torchrun(
            tmp_path,
            "two",
            tmp_path / f"cache{node}",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "two-machines",
        )
        for node in (0, 1)
    ]
    for proc in machines:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, _why_it_failed(err)
    one = _torchrun(tmp_path, "one", tmp_path / "cache_one", "--nproc-per-node", "2",
                    "--master-port", str(free_port()))  # fmt: skip
    _, err = one.communicate(timeout=600)
    assert one.returncode == 0, _why_it_failed(err)
    for node in (0, 1):  # each machine's cache folder holds the ids
        assert list((tmp_path / f"cache{node}").glob("tokens/*/stats.json")), node
    a, b = (checkpoint.load(tmp_path / run / "last.pt") for run in ("two", "one"))
    assert a["train_state"]["step"] == b["train_state"]["step"] == 6
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)


def _rank_pid(run_dir, rank: int, wait: float = 120.0) -> int:
    """The pid of the `mt train` worker of `rank` training into `run_dir` (read from /proc)."""
    from pathlib import Path

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
                env = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
            except (OSError, ValueError):
                continue
            if f"--run-dir\0{run_dir}\0" in cmd and f"RANK={rank}" in env:
                return int(proc.name)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} training into {run_dir}")


def _wait_for(path, wait: float = 120.0) -> None:
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_hung_rank_ends_the_job_with_one_line_from_a_live_rank(tmp_path):
    """Rank 1 stopped (SIGSTOP) mid-run: rank 0 gives up after train.dist_timeout_minutes
    (12 s here) with one line saying so, no traceback; torchrun ends the job non-zero and no
    worker is left behind."""
    import signal

    download("synthetic", tmp_path / "d")
    how = ("--nproc-per-node", "2", "--master-port", str(free_port()))
    sets = ("train.dist_timeout_minutes=0.2", "train.log_every=5")
    proc = _torchrun(tmp_path, "hung", tmp_path / "cache", *how, *sets, steps=100000)
    _wait_for(tmp_path / "hung" / "train_log.jsonl")
    first, second = _rank_pid(tmp_path / "hung", 0), _rank_pid(tmp_path / "hung", 1)
    os.kill(second, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while os.path.exists(f"/proc/{first}") and time.monotonic() - stopped < 60:
            time.sleep(0.2)
        alive_for = time.monotonic() - stopped
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert 10 < alive_for < 40, alive_for  # the timeout, not sooner and not much later
    assert proc.returncode != 0
    said = [x for x in err.replace("\r", "\n").splitlines() if "error: rank 0:" in x]
    assert len(said) == 1 and "train.dist_timeout_minutes" in said[0], _why_it_failed(err)
    assert "[rank0]: Traceback" not in err
    assert not os.path.exists(f"/proc/{second}")  # torchrun took the stopped rank down too


def test_each_start_under_torchrun_has_keys_of_its_own_in_the_agents_store(monkeypatch):
    """torchrun's agent keeps one store for every start of the workers: a restarted group
    keys its addresses under its start (the dead workers' would be read otherwise); a first
    start, or a run without torchrun, takes the env:// default."""
    import torch.distributed as tdist

    from mt.runtime.distributed import _store_of_this_start

    port = free_port()
    server = tdist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert _store_of_this_start(0, 2, 1.0) == {}
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    given = _store_of_this_start(1, 2, 1.0)
    assert (given["rank"], given["world_size"]) == (1, 2)
    server.set("0/rank_0", "the dead worker's address")
    given["store"].set("0/rank_0", "the new one")
    assert server.get("0/rank_0") == b"the dead worker's address"
    assert given["store"].get("0/rank_0") == b"the new one"
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert _store_of_this_start(1, 2, 1.0) == {}


@pytest.mark.slow
def test_a_rank_killed_after_a_save_is_restarted_and_the_run_ends_as_if_never_stopped(tmp_path):
    """torchrun --max-restarts 1, rank 1 killed (SIGKILL) after the first save: torchrun
    starts both ranks again, `mt train` resumes from last.pt, and the run ends with the
    weights of the same run left alone, bit for bit."""
    import signal

    download("synthetic", tmp_path / "d")
    sets = ("train.save_every=8", "train.log_every=4", "train.average_last=0",
            "decode.tune_beams=[]")  # fmt: skip
    straight = _torchrun(tmp_path, "straight", tmp_path / "cache", "--nproc-per-node", "2",
                         "--master-port", str(free_port()), *sets, steps=40)  # fmt: skip
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, _why_it_failed(err)
    how = ("--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1",
           "--monitor-interval", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           f"127.0.0.1:{free_port()}")  # fmt: skip
    proc = _torchrun(tmp_path, "killed", tmp_path / "cache", *how, *sets, steps=40)
    try:
        _wait_for(tmp_path / "killed" / "last.pt")
        os.kill(_rank_pid(tmp_path / "killed", 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, _why_it_failed(err)
    assert "resuming from" in err  # (a second start, not a run that outlived the kill)
    a, b = (checkpoint.load(tmp_path / run / "last.pt") for run in ("killed", "straight"))
    assert a["train_state"]["step"] == b["train_state"]["step"] == 40
    for k, v in b["model"].items():
        assert torch.equal(a["model"][k], v), k


DDP_OBJECTIVES = {
    "cross-entropy, mt/fast's fused loss": [],
    "cross-entropy, the reference": ["train.fast_paths=false"],
    "R-Drop": ["train.rdrop_alpha=1.0", "model.dropout=0.1"],
    "scheduled sampling": [
        "train.scheduled_sampling.schedule=exponential",
        "train.scheduled_sampling.k=0.9",
    ],
    "Mask-Predict": ["model.arch=nat"],
    "RNN with attention": ["model.arch=rnn"],
    "decoder-only": ["model.arch=decoder_only"],
    "masked LM": [],  # (pretraining the encoder: the decoder has no gradient)
}


def _ddp_worker(rank, world, ports, data_dir, tmp, out):
    """Two updates of two micro-batches of every objective under DDP, then an out-of-memory
    batch on rank 1: what each rank saw."""
    seen = {}
    for (name, sets), port in zip(DDP_OBJECTIVES.items(), ports, strict=False):
        join_ranks(rank, world, port)
        cfg = tiny_config(data_dir, "train.data_parallel=ddp", "train.accum_steps=2", *sets)
        t = build_trainer(cfg, tmp / name, log=lambda *_: None, pretraining=name == "masked LM")
        before = {k: v.clone() for k, v in t.model.state_dict().items()}
        batches = t.batches()
        for _ in range(2):
            assert t.train_step([next(batches), next(batches)])
        t.settle_skips()
        seen[name] = {
            "update": type(t.update).__name__,
            "ddp": type(t.update.ddp).__name__,
            "step": t.state.step,
            "moved": [k for k, v in t.model.state_dict().items() if not torch.equal(v, before[k])],
            "model": t.model.state_dict(),
        }
        t.close()
    join_ranks(rank, world, ports[-1])
    t = build_trainer(
        tiny_config(data_dir, "train.data_parallel=ddp", "train.dist_timeout_minutes=0.05"),
        tmp / "oom", log=lambda *_: None,
    )  # fmt: skip
    if rank == 1:
        out_of_memory_on_call(t.model, 1)
    try:
        t.train_step([collate(t.train_data, np.arange(rank * 24, rank * 24 + 24))])
        seen["out of memory"] = "no error"
    except MTError as e:
        seen["out of memory"] = str(e)
    except RuntimeError:  # rank 0: DDP's all-reduce, left alone, times out
        seen["out of memory"] = "timed out"
    t.close()
    torch.save(seen, out / f"rank{rank}.pt")


@pytest.mark.slow
def test_every_objective_trains_under_ddp_and_out_of_memory_ends_the_run(tmp_path):
    """train.data_parallel: ddp with each objective (accumulation through no_sync; unused
    parameters where the masked LM leaves the decoder): the ranks' weights move and stay one
    model. An out-of-memory batch ends the run on the rank that had it, with one line."""
    download("synthetic", tmp_path / "data")
    (tmp_path / "out").mkdir()
    ports = [free_port() for _ in range(len(DDP_OBJECTIVES) + 1)]
    mp.spawn(
        _ddp_worker,
        args=(2, ports, tmp_path / "data", tmp_path, tmp_path / "out"),
        nprocs=2,
        join=True,
    )
    r0, r1 = (torch.load(tmp_path / "out" / f"rank{r}.pt") for r in (0, 1))
    for name in DDP_OBJECTIVES:
        assert r0[name]["update"] == "PlainUpdate" and r0[name]["step"] == 2, name
        assert r0[name]["ddp"] == "DistributedDataParallel", name
        trained = [k for k in r0[name]["model"] if "decoder" not in k or name != "masked LM"]
        assert r0[name]["moved"] and set(r0[name]["moved"]) <= set(trained), name
        for k, v in r0[name]["model"].items():  # one model
            assert torch.equal(v, r1[name]["model"][k]), (name, k)
    assert re.fullmatch(
        r"rank 1 ran out of memory at step 0 on batches of \d+ target tokens \(source \d+x\d+\); "
        r"under train.data_parallel: ddp that ends the run .*lower train.max_tokens, or use "
        r"train.data_parallel: flat, which skips such a batch on every rank",
        r1["out of memory"],
    )
    assert r0["out of memory"] == "timed out"  # (torchrun would have stopped it at once)
