import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mt.tokens import EOS, PAD

os.environ["HF_HUB_OFFLINE"] = "1"  # the hub is unreachable here; fail fast, not after retries
os.environ["HF_DATASETS_OFFLINE"] = "1"
# One thread in every test process: mt otherwise picks its thread count from how busy the
# machine is (mt/runtime/threads.py), and two runs that a test expects to be bit-identical
# (resumed vs uninterrupted) could then use different counts while the other pytest worker is
# busy.
os.environ.setdefault("MT_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


# Adam with a large epsilon moves each weight in proportion to its gradient, so float rounding in
# near-zero gradients cannot flip an update's sign and two runs can be compared tightly.
EXACT_ADAM = ("train.adam_eps=1.0", "train.lr_factor=100")


def tiny_config(data_dir, *more: str):
    """configs/tiny.yaml on `data_dir` for a trainer built in the test's process: no dropout,
    on the CPU (the ranks of these tests are gloo ranks, also on a machine with a GPU)."""
    from mt.config import load_config

    return load_config(
        ROOT / "configs" / "tiny.yaml",
        [f"data.dir={data_dir}", "model.dropout=0.0", "train.device=cpu", *more],
    )


def join_ranks(rank: int, world: int, port: int) -> None:
    """In a spawned process: be rank `rank` of `world` gloo ranks that meet at `port` on this
    machine, on one thread."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)


def cli_env(gpu: bool = False, **extra: str) -> dict:
    """The environment of a test's `mt` (or other Python) subprocess. Without `gpu` no GPU is
    visible to it, so that a test means the same on a GPU machine as in CI: its runs train and
    decode on the CPU, bit for bit comparable with the CPU models the test builds itself (a
    GPU's kernels sum in another order, and a tiny model's near-ties then flip tokens). The
    paths only a GPU takes are tested in test_cuda.py, with gpu=True."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def start_training(run, data, *sets) -> subprocess.Popen:
    """Start `mt train` of configs/tiny.yaml in the background (on the CPU), on the corpus in
    `data`, logging every update and running until stopped; its stderr readable as text.
    sets: more KEY=VALUE overrides."""
    args = ["train", ROOT / "configs/tiny.yaml", "--run-dir", run, "--set", f"data.dir={data}"]
    args += ["train.max_steps=100000", "train.log_every=1", *sets]
    return subprocess.Popen(
        [sys.executable, "-m", "mt", *map(str, args)],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_mt(*args, cwd=None, input=None, timeout=600, gpu=False):
    """Run the real CLI in a subprocess (on the CPU unless `gpu`); returns CompletedProcess."""
    env = cli_env(gpu)
    return subprocess.run(
        [sys.executable, "-m", "mt", *map(str, args)],
        cwd=cwd or ROOT,
        input=input,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def run_tiny(run, data, *sets, flags=(), gpu=False):
    """`mt train configs/tiny.yaml` into `run` on the corpus in `data` (made there the first
    time), with KEY=VALUE `sets` and other `flags`; it must succeed. Returns the process."""
    args = ["train", ROOT / "configs/tiny.yaml", "--run-dir", run, *flags]
    proc = run_mt(*args, "--set", f"data.dir={data}", *sets, gpu=gpu)
    assert proc.returncode == 0, proc.stderr
    return proc


def train_tiny(run, data, *sets) -> tuple[str, list[tuple[int, float]]]:
    """`mt train tiny` into `run` on the corpus in `data`, with KEY=VALUE `sets`; it must
    succeed. Returns its stderr and the training losses it logged, [(step, loss), ...]."""
    proc = run_tiny(run, data, *sets)
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    return proc.stderr, [(r["step"], r["loss"]) for r in records if "loss" in r]


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
    every = ["train.valid_every=60", "train.save_every=30", "train.log_every=20"]
    run_tiny(base / "run", base / "data", "train.max_steps=60", *every)
    return base / "run"


# -- small models and batches shared by the model, search and fast-path tests -------------
V = 40


def make_model(pre_norm=False, tie="all", seed=0, dropout=0.1, kind=None, **parts):
    """The tests' small Transformer (2+2 layers, d_model 32, vocabulary V), in eval mode;
    kind: another Transformer class (mt/fast's), parts: its `parts`."""
    from mt.model import LayerShape, Transformer

    torch.manual_seed(seed)
    shape = LayerShape(32, 4, 64, dropout=dropout, attn_dropout=dropout, pre_norm=pre_norm)
    return (kind or Transformer)(
        src_vocab=V,
        tgt_vocab=V,
        shape=shape,
        enc_layers=2,
        dec_layers=2,
        tie_embeddings=tie,
        max_positions=64,
        **parts,
    ).eval()


def tagged_translator(targets=("de", "fr"), more=()):
    """A Translator of an untrained model (make_model) of English into `targets` (and the
    pairs `more`: ("de", "en"), ...), whose BPE reserves each target's token (>>de<<, ...) as
    a run of several pairs does."""
    from mt.config import DecodeConfig
    from mt.data.pairs import Languages, Pair, tag
    from mt.data.tokenizer import Tokenizer, train_bpe
    from mt.decode.translator import Translator

    words = ["a man rides a red bike", "two dogs run in the snow", "a woman sings"] * 20
    pairs = tuple(Pair("en", t) for t in targets) + tuple(Pair(*p) for p in more)
    bpe = train_bpe(
        words, vocab_size=V, symbols=tuple(tag(t) for t in sorted({p.tgt for p in pairs}))
    )
    languages = Languages(pairs, pairs[0])
    return Translator(
        make_model(), Tokenizer(bpe), DecodeConfig(), torch.device("cpu"), None, languages
    )


def make_src(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src


# -- the one search, called as the tests need it -------------------------------------------------


def searched(model, src, mask, pace=None, compiled=None, forced=(), generator=None,
             on_step=None, **options):  # fmt: skip
    """mt.decode.search.search with DecodeOptions(**options): per sentence [(ids, score)]."""
    from mt.decode.options import DecodeOptions
    from mt.decode.search import EVERY_STEP, search

    opts = DecodeOptions(**options)
    pace = pace or EVERY_STEP
    return search(model, src, mask, opts, forced, generator, pace, compiled, on_step)


@pytest.fixture
def beam_of_one(monkeypatch):
    """The search's Beam rule also for beam 1 (which the search otherwise hands to Pick, the
    greedy rule): for the tests that beam 1 equals greedy search."""
    import mt.decode.search as s

    def rule(opts, b, steps, dev, generator):
        if opts.beam == 1 and opts.sampling is None:
            return s.Beam(b, 1, steps, dev)
        return real(opts, b, steps, dev, generator)

    real = s._rule
    monkeypatch.setattr(s, "_rule", rule)


def beam_nbest(model, src, mask, beam, nbest=1, length_penalty=1.0, max_len_a=1.5,
               max_len_b=10, **kw):  # fmt: skip
    """Each sentence's `nbest` (ids, score), best first."""
    return searched(model, src, mask, beam=beam, nbest=nbest, length_penalty=length_penalty,
                    max_len_a=max_len_a, max_len_b=max_len_b, **kw)  # fmt: skip


def beam_search(model, src, mask, beam, length_penalty=1.0, max_len_a=1.5, max_len_b=10, **kw):
    """Each sentence's best hypothesis (ids)."""
    found = beam_nbest(model, src, mask, beam, 1, length_penalty, max_len_a, max_len_b, **kw)
    return [f[0][0] if f else [] for f in found]


def greedy(model, src, mask, max_len_a=1.5, max_len_b=10, **kw):
    """Each sentence's greedy output (ids); sampling=Sampling(...) draws instead."""
    found = searched(model, src, mask, beam=1, max_len_a=max_len_a, max_len_b=max_len_b, **kw)
    return [f[0][0] for f in found]


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


def pytest_runtest_logreport(report):
    """With MT_TEST_FAILURE_LOG set, each failure's traceback is written to that file as it
    happens: a suite cut off by a time limit (on a GPU machine) prints none of them."""
    path = os.environ.get("MT_TEST_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def window_losses(trainer) -> torch.Tensor:
    """Each update's loss sum since the trainer's last log line (on the device)."""
    return torch.stack(trainer.window.sums)[:, 0]


def mt_here(*args, input=None):
    """The real CLI run in this process (typer's CliRunner): (exit code, stdout, stderr).
    For the cases that need no process of their own (no signals, no torchrun, no GPU)."""
    from typer.testing import CliRunner

    from mt.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def trainer_for(tmp_path, *overrides):
    """configs/tiny.yaml's Trainer for a run in tmp_path/run on data in tmp_path/d, with
    overrides (as --set takes them), on the CPU."""
    # on the CPU on every machine: the tests feed CPU batches to train_step, and on a GPU
    # machine "auto" would put the model on the GPU (a test means the same there as in CI;
    # tests/test_cuda.py takes the GPU's paths)
    from mt.config import load_config
    from mt.train.build import build_trainer

    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.log_every=2", "train.device=cpu", *overrides],
    )
    return build_trainer(cfg, tmp_path / "run", log=lambda *_: None)


def poison(trainer, bad_calls):
    """Make the model's output NaN on the given forward calls (1-based): its decoder states,
    by decode or, for a packed batch, laid_out."""
    calls = [0]

    def poisoned(real):
        def forward(*a, **k):
            calls[0] += 1
            out = real(*a, **k)
            return out * float("nan") if calls[0] in bad_calls else out

        return forward

    for name in ("decode", "laid_out"):
        if hasattr(trainer.model, name):
            setattr(trainer.model, name, poisoned(getattr(trainer.model, name)))
