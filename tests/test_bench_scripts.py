"""The benchmark scripts import mt's internals; a refactor must not leave them broken. One
training step per contender (no timing is asserted) keeps them runnable."""
import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    """A script from scripts/ as a module (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_train():
    return _load("bench_train")


@pytest.mark.parametrize("name", ["ours", "torch", "hf"])
def test_bench_train_contenders_take_a_step_on_the_same_batches(bench_train, name):
    if name == "hf" and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (pip install -e '.[bench]')")
    import torch
    r = bench_train.run_one(name, bench_train.SIZES["small"], steps=1, warmup=0,
                            device=torch.device("cpu"), precision="fp32", compile_ours=False,
                            matmul_n=256)      # a small product: the smoke test, not the peak
    assert r["tok_s"] > 0 and r["peak_rss_mb"] > 0 and r["matmul_flop_s"] > 0
    assert 0 <= r["padding"] < 0.2
    assert 7_000_000 < r["params"] < 8_500_000       # the three models have the same size


def test_bench_decode_and_data_import():
    for name in ["bench_decode", "bench_data"]:
        _load(name)


def test_bench_train_turns_give_every_contender_its_own_rate(bench_train):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (pip install -e '.[bench]')")
    import torch
    rates = bench_train.run_interleaved(bench_train.SIZES["small"], steps=1, warmup=0,
                                        device=torch.device("cpu"), precision="fp32")
    assert set(rates) == {"ours", "torch", "hf"} and all(r > 0 for r in rates.values())


def test_bench_decode_turns_rotate_who_goes_first():
    """Every contender decodes every batch once (after one warm-up batch), and the one that
    goes first rotates, so neither always meets the machine warmed (or slowed) by the other."""
    import numpy as np
    bench = _load("bench_decode")
    calls = []
    decoders = {name: (lambda src, name=name: calls.append((name, src.shape[0])))
                for name in ["ours", "hf"]}

    class Args:
        batch_size = 2
    ids = [np.arange(1, n + 2) for n in range(7)]                    # 4 batches: 2, 2, 2, 1
    secs = bench.taking_turns(decoders, ids, Args)
    assert set(secs) == {"ours", "hf"} and all(s >= 0 for s in secs.values())
    timed = calls[2:]                                                # after the warm-ups
    assert [n for n, _ in timed] == ["ours", "hf", "hf", "ours", "ours", "hf", "hf", "ours"]
    assert [b for _, b in timed] == [2, 2, 2, 2, 2, 2, 1, 1]
