"""The benchmark scripts import mt's internals; a refactor must not leave them broken. One
training step per contender (no timing is asserted) keeps them runnable."""

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_mt

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BENCH = SCRIPTS / "bench"


def _load(name: str, folder: Path = BENCH):
    """A script from scripts/ as a module (they are not a package; run as scripts, they find
    their sibling modules, such as harness.py, on the path Python gives them)."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_train():
    return _load("bench_train")


@pytest.fixture(scope="module")
def contenders():
    return _load("contenders")


@pytest.mark.parametrize("name", ["ours", "torch", "hf"])
def test_bench_train_contenders_take_a_step_on_the_same_batches(bench_train, contenders, name):
    if name == "hf" and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (pip install -e '.[bench]')")
    import torch

    r = bench_train.run_one(
        name,
        contenders.SIZES["small"],
        steps=1,
        warmup=0,
        device=torch.device("cpu"),
        precision="fp32",
        compile_ours=False,
        matmul_n=256,
    )  # a small product: the smoke test, not the peak
    assert r["tok_s"] > 0 and r["peak_rss_mb"] > 0 and r["matmul_flop_s"] > 0
    assert 0 <= r["padding"] < 0.2
    assert 7_000_000 < r["params"] < 8_500_000  # the three models have the same size


def test_bench_nat_scores_and_times_every_decoder(tiny_run, tmp_path):
    """scripts/bench/bench_nat.py on a NAT run and an autoregressive one: BLEU and chrF per
    decoder, and sentences/s at batch 1 and in batches for each, in the JSON it writes."""
    data = tiny_run.parent / "data"
    nat = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "nat",
        "--set",
        f"data.dir={data}",
        "model.arch=nat",
        "train.max_steps=10",
        "train.valid_every=10",
    )
    assert nat.returncode == 0, nat.stderr
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_nat.py"),
            "--nat",
            str(tmp_path / "nat"),
            "--ar",
            str(tiny_run),
            "--data-dir",
            str(data),
            "--src-lang",
            "src",
            "--tgt-lang",
            "tgt",
            "--iterations",
            "1,3",
            "--sentences",
            "4",
            "--batch",
            "2",
            "--json",
            str(tmp_path / "nat.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "nat.json").read_text())
    names = {"AR greedy", "AR beam 5", "NAT T=1", "NAT T=3"}
    assert set(result["quality"]) == names
    assert all(0 <= row[k] <= 100 for row in result["quality"].values() for k in ("bleu", "chrf"))
    for label in ("batch 1", "batches of 2"):
        assert set(result[label]) == names and all(r > 0 for r in result[label].values())


def test_bench_decode_and_data_import():
    for name in ["bench_decode", "bench_data"]:
        _load(name)


def test_bench_train_batches_count_their_tokens_and_come_in_few_shapes(contenders):
    """Each batch carries its target-token count, counted on the host (equal to the non-padding
    target positions); with --shape-buckets 8 the widths are multiples of 8, each width pair
    has one row count within the token budget, and 30 batches come in a few shapes."""
    plain = contenders.make_batches(contenders.size_of("tiny", 2048, vocab=500), 30)
    size = contenders.size_of("tiny", 2048, vocab=500, shape_buckets=8)
    assert size["vocab"] == 500 and contenders.SIZES["tiny"]["vocab"] == 5000
    bucketed = contenders.make_batches(size, 30)
    for src, tgt_in, tgt_out, n in plain + bucketed:
        assert n == int((tgt_out != contenders.PAD).sum()) > 0
        assert tgt_in.shape == tgt_out.shape and int(src.max()) < 500
    shapes = {(b[0].shape, b[2].shape[1]) for b in bucketed}
    assert len(shapes) < len({(b[0].shape, b[2].shape[1]) for b in plain}) and len(shapes) <= 8
    rows_of = {}
    for (rows, s_w), t_w in shapes:
        assert s_w % 8 == 0 and t_w % 8 == 0 and rows * (s_w + t_w) <= 2048
        assert rows_of.setdefault((s_w, t_w), rows) == rows


def test_bench_train_step_reads_nothing_the_trainer_does_not(contenders, monkeypatch):
    """mt's contender adds no host read of its own to Trainer.train_step's (the references pay
    none): the reads during a bench step equal those inside train_step."""
    import torch

    from mt.runtime.host_syncs import HostSyncs
    from mt.train.trainer import Trainer

    inside, real = [], Trainer.train_step

    def counted(self, batches):
        with HostSyncs() as syncs:
            done = real(self, batches)
        inside.append(syncs.count)
        return done

    monkeypatch.setattr(Trainer, "train_step", counted)
    monkeypatch.setattr(contenders, "FAST_PATHS", False)
    size = contenders.size_of("tiny", 1024, vocab=500)
    batch = contenders.device_batches(size, 1, torch.device("cpu"))[0]
    _, step = contenders.ours(size, torch.device("cpu"))
    with HostSyncs() as outside:
        step(batch)
    assert inside and outside.count == sum(inside)


def test_bench_train_turns_give_every_contender_its_own_rate(contenders):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (pip install -e '.[bench]')")
    import torch

    rates = contenders.run_interleaved(
        contenders.SIZES["small"], steps=1, warmup=0, device=torch.device("cpu"), precision="fp32"
    )
    assert set(rates) == {"ours", "torch", "hf"} and all(r > 0 for r in rates.values())


def test_bench_rdrop_times_the_trainer_step_with_each_loss(contenders):
    """scripts/bench/bench_rdrop.py's contenders are contenders.py's `ours` (Trainer.train_step)
    with the loss swapped: every loss it names is the one the trainer calls, and the script
    runs."""
    import torch

    from mt.objectives.loss import reference_loss

    called = []

    def loss(model, batch, eps):
        called.append(batch.n_tokens)
        return reference_loss(model, batch, eps)

    size = dict(contenders.SIZES["tiny"], max_tokens=512)
    batches = contenders.device_batches(size, 2, torch.device("cpu"))
    _, step = contenders.ours(size, torch.device("cpu"), loss_fn=loss, dropout=0.3)
    for b in batches:
        step(b)
    assert called == [int((b[2] != contenders.PAD).sum()) for b in batches]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_rdrop.py"), "--steps", "1", "--warmup", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "s/step" in line]
    assert [r.split("  ")[0].strip() for r in rows] == [
        "plain (fused)",
        "R-Drop, reference",
        "R-Drop, fused",
    ]
    assert rows[0].endswith("x1.00 the plain step")


def test_bench_decode_turns_rotate_who_goes_first():
    """Every contender decodes every batch once (after one warm-up batch), and the one that
    goes first rotates, so neither always meets the machine warmed (or slowed) by the other."""
    import numpy as np
    import torch

    bench = _load("bench_decode")
    calls = []
    decoders = {
        name: (lambda src, name=name: calls.append((name, src.shape[0]))) for name in ["ours", "hf"]
    }

    class Args:
        batch_size = 2
        device = torch.device("cpu")

    ids = [np.arange(1, n + 2) for n in range(7)]  # 4 batches: 2, 2, 2, 1
    secs = bench.taking_turns(decoders, ids, Args)
    assert set(secs) == {"ours", "hf"} and all(s >= 0 for s in secs.values())
    timed = calls[2:]  # after the warm-ups
    assert [n for n, _ in timed] == ["ours", "hf", "hf", "ours", "ours", "hf", "hf", "ours"]
    assert [b for _, b in timed] == [2, 2, 2, 2, 2, 2, 1, 1]


@pytest.fixture(scope="module")
def race():
    return _load("race")


def test_race_patch_is_in_place_for_b_only_and_undone(race):
    """B's steps run with the patched attribute and A's without; after the race the module
    has its own object back. The patches change no arithmetic here (these batches have fewer
    rows than either chunk size), and each side draws its own dropout masks: equal weights."""
    import torch

    import mt.fast.modules as layers
    import mt.fast.nodes as fused

    calls = {"patched": 0}
    original = layers.feed_forward

    def counting(*args):
        calls["patched"] += 1
        return original(*args)

    patches = [(layers, "feed_forward", counting), (fused, "FFN_CHUNK_ROWS", 2048)]
    size = dict(race.bt.SIZES["small"], max_tokens=600)
    makers = {"A": race.patched_mt([]), "B": race.patched_mt(patches)}
    r = race.run_race(size, makers, steps=1, warmup=1, device=torch.device("cpu"))
    assert layers.feed_forward is original and fused.FFN_CHUNK_ROWS == 1024
    # two rounds (B built second, then first) of B's two batches, encoder and decoder layers
    assert calls["patched"] == 2 * 2 * 2 * size["layers"]
    assert len(r["round_ratios"]["B"]) == 2 and r["round_ratios"]["A"] == [1.0, 1.0]
    assert r["tok_s"]["A"] > 0 and r["tok_s"]["B"] > 0 and r["vs_a"]["B"] > 0
    assert r["max_param_diff"] == 0.0


def test_race_sees_different_arithmetic(race):
    """A patch that changes what is computed (no dropout in B's feed-forwards) shows in the
    weights after one step."""
    import torch

    import mt.fast.modules as layers

    original = layers.feed_forward

    def without_dropout(x, w1, b1, w2, b2, p):
        return original(x, w1, b1, w2, b2, 0.0)

    size = dict(race.bt.SIZES["small"], max_tokens=600)
    patches = [(layers, "feed_forward", without_dropout)]
    makers = {"A": race.patched_mt([]), "B": race.patched_mt(patches)}
    r = race.run_race(size, makers, steps=1, warmup=0, device=torch.device("cpu"), rounds=1)
    assert r["max_param_diff"] > 0


def test_race_b_precision_trains_b_alone_under_bf16_autocast(race, monkeypatch):
    """--b-precision bf16: B's forward runs under bf16 autocast and A's in fp32, so with no
    patch at all (an A/A otherwise, 0.0 apart) the weights differ after one step."""
    import torch

    import mt.train.update.step as step_module

    seen = []
    original = step_module.forward

    def recording(model, loss, batch, device, amp_dtype):
        seen.append(amp_dtype)
        return original(model, loss, batch, device, amp_dtype)

    monkeypatch.setattr(step_module, "forward", recording)
    size = dict(race.bt.SIZES["tiny"], max_tokens=600)
    makers = {"A": race.patched_mt([]), "B": race.patched_mt([], "bf16")}
    r = race.run_race(size, makers, steps=1, warmup=0, device=torch.device("cpu"), rounds=1)
    assert sorted(map(str, seen)) == ["None", "torch.bfloat16"]  # one step each side
    assert r["max_param_diff"] > 0 and r["tok_s"]["A"] > 0 and r["tok_s"]["B"] > 0


@pytest.mark.parametrize(
    "spec, says",
    [
        ("mt.fast.nodes", "write MODULE:NAME=VALUE"),
        ("mt.fast.nodes:NO_SUCH=1", "has no attribute 'NO_SUCH'"),
        ("no_such_module:x=1", "cannot import no_such_module"),
        ("mt.fast.nodes:FFN_CHUNK_ROWS=/nowhere/f.py:g", "no file /nowhere/f.py"),
        ("mt.fast.nodes:FFN_CHUNK_ROWS=mt.fast.nodes:no_such", "cannot load"),
    ],
)
def test_race_bad_patch_is_one_clear_line(race, spec, says):
    with pytest.raises(race.PatchError, match=says):
        race.resolve_patch(spec)


def test_race_patch_values(race, tmp_path):
    import mt.fast.nodes as fused

    assert race.resolve_patch("mt.fast.nodes:FFN_CHUNK_ROWS=512") == (
        fused,
        "FFN_CHUNK_ROWS",
        512,
    )
    assert (
        race.resolve_patch("mt.fast.nodes:feed_forward=mt.fast.nodes:add_norm")[2] is fused.add_norm
    )
    (tmp_path / "mine.py").write_text("def f(*a):\n    return 'mine'\n")
    assert race.resolve_patch(f"mt.fast.nodes:feed_forward={tmp_path}/mine.py:f")[2]() == "mine"


def test_race_runs_every_kind_of_contender_from_its_command_line(tmp_path):
    """`race.py --patch ... --commit HEAD --shape ...`: A, B, the commit, the shape and A
    again each take their steps and get a line; a bad shape is one line (no timing is
    asserted)."""
    flags = "--size tiny --max-tokens 600 --steps 1 --warmup 0 --rounds 1 --json --commit HEAD"
    more = ["--patch", "mt.fast.nodes:FFN_CHUNK_ROWS=2048", "--shape", "2+1:d_ff=128,vocab=400"]
    command = [sys.executable, str(BENCH / "race.py"), *flags.split(), *more]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.splitlines()[-1])
    assert list(r["tok_s"]) == ["A", "B", "HEAD", "2+1:d_ff=128,vocab=400", "A again"]
    assert r["max_param_diff"] == 0.0 and r["vs_a"]["A"] == 1.0
    bad = subprocess.run([*command[:2], "--shape", "7:heads=2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--shape '7:heads=2': write ENC+DEC" in bad.stderr


# -- scripts/mkl_amd_shim.sh ----------------------------------------------------------------
def _cpu_flags() -> set[str]:
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    return {w for line in text.splitlines() if line.startswith("flags") for w in line.split()}


def _torch_has_mkl() -> bool:
    import torch

    return torch.backends.mkl.is_available()


needs_shim_tools = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("cc") is None or not _torch_has_mkl(),
    reason="the MKL shim needs x86-64, a C compiler (cc) and a PyTorch built with MKL",
)


@needs_shim_tools
def test_mkl_shim_makes_mkl_take_its_avx2_path_and_matmuls_stay_right(tmp_path):
    built = subprocess.run(
        ["bash", str(SCRIPTS / "mkl_amd_shim.sh"), str(tmp_path)], capture_output=True, text=True
    )
    if not {"avx2", "fma"} <= _cpu_flags():
        assert built.returncode == 1 and "no AVX2/FMA" in built.stderr
        return
    lib = tmp_path / "libmkl_intel_cpu.so"
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip().startswith(f"export LD_PRELOAD={lib}")
    # MKL's CPU type: 0 is its generic path (what it picks on AMD without the shim), 5 AVX2
    probe = (
        "import ctypes, os, torch\n"
        "lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', "
        "'libtorch_cpu.so'))\n"
        "torch.manual_seed(0)\n"
        "a = torch.randn(300, 200, dtype=torch.float64)\n"
        "b = torch.randn(200, 500, dtype=torch.float64)\n"
        "err = ((a.float() @ b.float()).double() - a @ b).abs().max().item()\n"
        "print(lib.mkl_serv_cpu_detect(), err)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "LD_PRELOAD": str(lib)},
    )
    assert out.returncode == 0, out.stderr
    cpu_type, err = out.stdout.split()
    assert int(cpu_type) >= 5  # AVX2 or better
    assert float(err) < 1e-3  # fp32 products of O(10) values: right to ~1e-5


@needs_shim_tools
def test_mkl_shim_without_a_compiler_says_so_and_builds_nothing(tmp_path):
    if not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this CPU has no AVX2/FMA: the script stops before looking for a compiler")
    built = subprocess.run(
        ["bash", str(SCRIPTS / "mkl_amd_shim.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "CC": "/no/such/cc"},
    )
    assert built.returncode == 1 and built.stdout == ""
    assert built.stderr.count("\n") == 1 and "no C compiler '/no/such/cc'" in built.stderr
    assert not (tmp_path / "out").exists()


def test_recipe_summary_reads_a_run_log(tmp_path):
    """scripts/lab/recipe_summary.py: the curve, the average (kept or not) and the tuned beam."""
    records = [
        {"step": 1000, "valid_bleu": 17.7, "valid_loss": 3.9},
        {"step": 1000, "loss": 4.0},
        {"step": 2000, "valid_bleu": 27.0, "best": True},
        {"step": 2000, "averaged": 10, "valid_bleu": 26.5},
        {"step": 2000, "tuned_decoding": {"beam": 5, "length_penalty": 1.4, "valid_bleu": 28.1}},
    ]
    (tmp_path / "r").mkdir()
    (tmp_path / "r/train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    line = _load("recipe_summary", SCRIPTS / "lab").summary(tmp_path / "r")
    assert line == (
        "r: greedy valid BLEU 1000: 17.7, 2000: 27.0; average of the last 10: 26.5 "
        "(not kept); tuned: beam 5, length penalty 1.4, 28.1"
    )


def test_race_builds_the_shapes_it_is_given(race):
    """scripts/bench/race.py --shape compares layer splits and widths against A's: each shape
    it times must be the model it names, or its ratios are about the wrong models."""
    import torch

    size = race.parse_shape("7+2:heads=2,d_ff=512", race.bt.SIZES["tiny"])
    assert (size["enc_layers"], size["dec_layers"], size["heads"], size["d_ff"]) == (7, 2, 2, 512)
    assert size["d_model"] == race.bt.SIZES["tiny"]["d_model"]  # the rest is the base shape
    model, _ = race.shaped_mt(dict(size, max_tokens=512))(size, torch.device("cpu"))
    assert (len(model.encoder), len(model.decoder)) == (7, 2)
    assert model.encoder[0].self_attn.n_heads == model.decoder[1].cross_attn.n_heads == 2
    assert model.encoder[0].ffn.net[0].out_features == 512
    with pytest.raises(ValueError):
        race.parse_shape("7:heads=2", race.bt.SIZES["tiny"])


def test_bench_serve_loads_both_modes_and_loses_nothing(tiny_run):
    pytest.importorskip("fastapi")
    sentences = tiny_run.parent / "data" / "test.src"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_serve.py"),
            "--model",
            str(tiny_run),
            "--sentences",
            str(sentences),
            "--clients",
            "3",
            "--requests",
            "9",
            "--beam",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for mode in ("batching", "no_batching"):
        assert result[mode]["errors"] == 0 and result[mode]["lost"] == 0
        assert result[mode]["wrong"] == 0 and result[mode]["torch_threads"] >= 1
        assert result[mode]["requests_per_s"] > 0
    # without batching every request is its own batch (9 timed + 8 warm-up)
    assert result["no_batching"]["health"]["batches"] == 17
    assert result["batching"]["health"]["batches"] <= 17


def test_bench_token_cache_builds_maps_and_measures_ranks(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_token_cache.py"),
            "--pairs",
            "3000",
            "--ranks",
            "2",
            "--max-tokens",
            "4096",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MT_CACHE_DIR": str(tmp_path)},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pairs"] > 2900 and result["batches"] > 0
    assert result["target_tokens"] > 0 and result["collate_tgt_tok_per_s"] > 0
    for mode in ("cache", "copies"):
        assert result[f"ranks_2_{mode}"]["pss_mb_total"] > 0
    assert len(list((tmp_path / "tokens").iterdir())) == 1  # written where it was told


def _gpu_check_dry_run(out, *parts: str) -> None:
    """scripts/gpu_check.sh --dry-run OUT PARTS, one thread a process; it must succeed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--dry-run", str(out), *parts],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_gpu_check_help_prints_its_usage_and_starts_nothing(tmp_path):
    """--help prints the header's usage (its parts among it) and exits 0 in a second, taking
    no folder, installing and writing nothing; an unknown option is one line, status 2."""
    script = str(SCRIPTS / "gpu_check.sh")
    r = subprocess.run(
        ["bash", script, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=20
    )
    assert r.returncode == 0 and "PARTs:" in r.stdout and "mfu" in r.stdout, r.stderr
    assert not (ROOT / "--help").exists() and not list(tmp_path.iterdir())  # (no OUTDIR made)
    r = subprocess.run(
        ["bash", script, "--hepl"], capture_output=True, text=True, cwd=tmp_path, timeout=20
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--hepl" in r.stderr, r.stderr


def test_gpu_check_dry_run_writes_every_figure_of_both_parts(tmp_path):
    """scripts/gpu_check.sh --dry-run runs the GPU check's two parts on the CPU (tiny sizes,
    aot_eager): each writes its JSON line with every key, the packed step compiled once."""
    figures = _load("gpu_figures")
    _gpu_check_dry_run(tmp_path, "mfu", "m30k")
    for part, keys in figures.KEYS.items():
        lines = (tmp_path / f"{part}.json").read_text().splitlines()
        assert len(lines) == 1, part
        got = json.loads(lines[0])
        assert sorted(got) == sorted(keys), part
        # (the step's one graph, and the update's bookkeeping: settle)
        assert got["part"] == part and got["graphs"] == 2 and got["block"][1] == 128
        assert got["updates"] > 0 and got["target_tokens_s"] > 0 and got["compile_s"] > 0
        assert got["recompiles"] == 0 and got["cudagraph_skips"] == 0  # (one shape: one graph)
    m30k = json.loads((tmp_path / "m30k.json").read_text())
    assert m30k["max_steps"] == 30000  # the shipped config's budget
    forecast = m30k["max_steps"] / m30k["updates_s"] / 60
    assert abs(m30k["forecast_minutes"] - forecast) <= 0.06 + 0.01 * forecast
    mfu = json.loads((tmp_path / "mfu.json").read_text())
    assert 0 < mfu["mfu_matmul"] < 1 and 0 < mfu["padding"] < 0.5


def test_gpu_check_dry_run_profiles_both_models(tmp_path):
    """gpu_check.sh --dry-run OUT profile: each model's line in profile.json with every key,
    the time its updates spent (the profiler saw them: the operators of the compiled step
    among the top ones), its table, and a timeline Chrome's trace viewer reads."""
    import gzip

    keys = _load("gpu_profile").KEYS
    _gpu_check_dry_run(tmp_path, "profile")
    lines = [json.loads(x) for x in (tmp_path / "profile.json").read_text().splitlines()]
    assert [r["model"] for r in lines] == ["base", "m30k"]
    for r in lines:
        assert "error" not in r and sorted(r) == sorted(keys) and r["part"] == "profile", r
        assert r["updates"] > 0 and r["wall_ms"] > 0 and 0 < r["host_ms"] <= 2 * r["wall_ms"]
        names = [t["name"] for t in r["top"]]
        assert len(names) == 15 and any("Compiled" in n or n == "aten::mm" for n in names), names
        assert r["top"][0]["host_ms"] >= r["top"][-1]["host_ms"] > 0  # (host time, best first)
        table = (tmp_path / f"profile_{r['model']}.txt").read_text()
        assert "Self CPU" in table and "aten::mm" in table
        with gzip.open(tmp_path / f"trace_{r['model']}.json.gz", "rt") as f:
            assert json.load(f)["traceEvents"]


def test_gpu_check_dry_run_ablates_each_variant_compiled_afresh(tmp_path):
    """gpu_check.sh --dry-run OUT ablate: a line a variant in ablate.json, each compiled in
    a fresh Dynamo (its own graphs: the step and settle), rows as wide as the variant says;
    wider rows leave less padding on the same pairs."""
    ablate = _load("gpu_ablate")
    _gpu_check_dry_run(tmp_path, "ablate", "ablatem30k")
    rows = {
        r["variant"]: r
        for model in ("base", "m30k")
        for r in map(json.loads, (tmp_path / f"ablate_{model}.json").open())
    }
    assert list(rows) == [*ablate.BASE_VARIANTS, *ablate.M30K_VARIANTS]
    for r in rows.values():
        assert "error" not in r and r["graphs"] == 2 and r["block"][1] == r["pack_width"], r
        assert r["recompiles"] == 0, r
        assert r["target_tokens_s"] > 0 and r["compile_s"] > 0
    assert rows["autotune"]["max_autotune"] is True
    assert rows["pack256"]["padding"] < rows["base"]["padding"]
    assert rows["m30k_pack256"]["updates_s"] > 0 and rows["m30k"]["max_steps"] == 30000
    assert rows["m30k_graph_chunk"]["sets"] == [
        "train.update=graph",
        "train.compiled_loss_chunk=2048",
    ]


def test_gpu_figures_count_the_flops_of_each_packed_pair():
    """The FLOPs of a packed block are the sum over its pairs of what that pair costs alone:
    the pair lengths come back from the segments as the data holds them, and a block's count
    equals contenders.py's count of the same pairs each in a padded row of its own."""
    import numpy as np
    import torch

    from mt.data.batching import collate_packed
    from mt.data.packing import pack_blocks, rows_of

    figures, contenders = _load("gpu_figures"), _load("contenders")
    data = figures.synthetic_pairs(vocab=50, n=60, longest=20, seed=3)
    (block, *_) = pack_blocks(data.src.lengths, data.tgt.lengths, 64, 8, seed=1)
    batch = collate_packed(data, block, 64, 8)
    pairs = np.concatenate([r[:-1] for r in rows_of(block)])
    assert (
        figures.pair_lengths(batch.packing.src_segments).tolist()
        == (data.src.lengths[pairs] + 1).tolist()
    )
    assert (
        figures.pair_lengths(batch.packing.tgt_segments).tolist()
        == (data.tgt.lengths[pairs] + 1).tolist()
    )
    size = {"d_model": 16, "d_ff": 32, "layers": 2, "vocab": 50}
    alone = 0.0
    for i in pairs:  # each pair in a padded batch of one row: source + EOS, target + EOS
        src = torch.full((1, data.src.lengths[i] + 1), 5)
        tgt_out = torch.full((1, data.tgt.lengths[i] + 1), 5)
        alone += contenders.useful_flops((src, None, tgt_out, 0), size)
    assert figures.packed_flops(batch, size) == pytest.approx(alone, rel=1e-9)


def test_race_trains_another_commits_mt_beside_the_working_trees(race, tmp_path):
    """scripts/bench/race.py --commit: a commit's mt, extracted under another package name,
    imports beside the working tree's and takes a step on the same batch (HEAD here; no
    timing is asserted)."""
    import torch

    bench, name = race.extract("HEAD", tmp_path)
    assert name == "mt_HEAD" and bench.__name__ == "bench_mt_HEAD"
    size = race.bt.size_of("tiny", 600)
    batch = race.bt.device_batches(size, 1, torch.device("cpu"))[0]
    torch.manual_seed(0)
    _, theirs = race.commit_mt(bench)(size, torch.device("cpu"))
    assert sys.modules[f"{name}.train.trainer"].__file__.startswith(str(tmp_path))
    theirs(batch)  # one update of HEAD's trainer


@pytest.mark.slow
def test_bench_ddp_runs_every_exchange_on_two_ranks():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_ddp.py"), "--size", "tiny", "--steps", "1",
         "--warmup", "1", "--rounds", "1", "--max-tokens", "1024"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert rows == ["flat", "ddp", "copy"], proc.stdout


@pytest.mark.slow
def test_bench_host_compares_the_base_commit_with_the_working_tree():
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git history (a worktree of the base commit)")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_host.py"), "--accum", "2", "--updates", "1",
         "--rounds", "1", "--warmup", "1", "--profiled", "1"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    eager = next(x for x in lines if " eager " in x)
    assert eager.split()[0] == "2" and "->" in eager, proc.stdout


def test_the_fifteen_minute_sequence_dry_runs_within_its_scaled_budgets(tmp_path):
    """docs/gpu.md's sequence, `gpu_check.sh OUT first` then `OUT second`, on the CPU at tiny
    sizes with every part's budget halved: each call ends within half its limit (540 s, 230
    s), and returns every phase's JSON line with every key: the user's job (train, keep the
    run, translate, score), the decodings (the compiled step gives the eager step's outputs,
    one graph a search), and the GPU tests (each skipped or passed on the CPU)."""
    from mt.decode.translator import Translator

    job = _load("gpu_job")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPU_CHECK_SCALE": "0.5"}
    for call, limit in (("first", 540), ("second", 230)):
        began = time.perf_counter()
        r = subprocess.run(
            ["bash", str(SCRIPTS / "gpu_check.sh"), "--dry-run", str(tmp_path), call],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=limit,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert time.perf_counter() - began < 0.5 * limit, call
    for part, phases in job.KEYS.items():
        lines = [json.loads(x) for x in (tmp_path / f"{part}.json").read_text().splitlines()]
        assert [x["phase"] for x in lines] == [
            p for p in phases for _ in range(1 + (p == "decode"))
        ]
        for line in lines:
            assert sorted(line) == sorted(phases[line["phase"]]), line
    job_lines = {x["phase"]: x for x in map(json.loads, (tmp_path / "job.json").open())}
    training = job_lines["training"]
    assert training["updates"] == 60 and training["stopped"] == "end"
    assert training["budget_minutes"] == pytest.approx((170 - 170 / 4) / 60, abs=0.02)
    assert job_lines["validations"]["count"] == 3 and job_lines["compile"]["recompiles"] == 0
    assert job_lines["kept"]["files"] == ["best.pt", "config.yaml", "train_log.jsonl"]
    Translator.load(tmp_path / "run", "cpu")  # (what a later call decodes with: JOB_RUN)
    assert job_lines["translation"]["sentences"] == 40 and job_lines["scoring"]["bleu"] >= 0
    total = job_lines["total"]
    assert total["train_translate_score_seconds"] <= total["seconds"] <= 170
    decodes = [json.loads(x) for x in (tmp_path / "decode.json").read_text().splitlines()]
    assert [d["beam"] for d in decodes] == [1, 5]
    assert all(d["same_outputs"] == d["sentences"] == 40 and d["graphs"] == 1 for d in decodes)
    # beam 5 after greedy: the one guard greedy's graph fails (one cross-attention row per
    # hypothesis there, a sentence's there) is the recompile
    assert [d["recompiles"] for d in decodes] == [0, 1]
    assert all(d["warm_process_first_s"] is not None for d in decodes)
    tests = (tmp_path / "pytest_cuda.log").read_text()
    assert " passed" in tests and "failed" not in tests and " ERROR " not in tests, tests
