import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mt.tokens import EOS, PAD

os.environ["HF_HUB_OFFLINE"] = "1"       # the hub is unreachable here; fail fast, not after retries
os.environ["HF_DATASETS_OFFLINE"] = "1"
# One thread in every test process: mt otherwise picks its thread count from how busy the
# machine is (mt/threads.py), and two runs that a test expects to be bit-identical (resumed vs
# uninterrupted) could then use different counts while the other pytest worker is busy.
os.environ.setdefault("MT_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def run_mt(*args, cwd=None, input=None, timeout=600):
    """Run the real CLI in a subprocess; returns CompletedProcess (text)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mt", *map(str, args)], cwd=cwd or ROOT,
                          input=input, capture_output=True, text=True, env=env, timeout=timeout)


def assert_user_error(proc, *needles):
    """Exit status 2, no traceback, and a message naming the problem."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A tiny model trained briefly on the synthetic task (shared by CLI tests)."""
    base = tmp_path_factory.mktemp("tiny")
    run = base / "run"
    proc = run_mt("train", ROOT / "configs/tiny.yaml", "--run-dir", run,
                  "--set", f"data.dir={base / 'data'}", "train.max_steps=60",
                  "train.valid_every=60", "train.save_every=30", "train.log_every=20")
    assert proc.returncode == 0, proc.stderr
    return run


# -- small models and batches shared by the model, search and fast-path tests -------------
V = 40


def make_model(pre_norm=False, tie="all", seed=0):
    from mt.model import Transformer
    torch.manual_seed(seed)
    return Transformer(src_vocab=V, tgt_vocab=V, d_model=32, n_heads=4, enc_layers=2,
                       dec_layers=2, d_ff=64, dropout=0.1, attn_dropout=0.1, pre_norm=pre_norm,
                       tie_embeddings=tie, max_positions=64).eval()


def make_src(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n - 1] = torch.randint(4, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src


def free_port() -> int:
    """A free TCP port on localhost, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def out_of_memory_on_call(model, n: int) -> None:
    """The model's n-th decode call (1-based) raises CUDA's out-of-memory error: both losses
    decode through it."""
    real, calls = model.decode, [0]

    def decode(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*a, **k)
    model.decode = decode
