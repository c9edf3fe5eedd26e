"""A GPU's whole job, checked on the CPU: the defaults take the compiled, packed step on a GPU
and leave a CPU's step as it was; the GPU-only tests and scripts import what exists."""

import pytest
import torch

from mt.config import load_config
from mt.train.parts import for_device
from tests.conftest import ROOT

CUDA, CPU = torch.device("cuda"), torch.device("cpu")  # (a device named, none needed)
SHIPPED = ["multi30k_en_de", "multi30k_de_en", "multi30k_en_de_d256", "multi30k_de_en_d256",
           "wmt14_en_de_base"]  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_compiles_and_packs_on_a_gpu_and_not_on_a_cpu(name):
    cfg = load_config(ROOT / f"configs/{name}.yaml")
    gpu, said = for_device(cfg, CUDA)
    width = gpu.train.pack_width
    assert gpu.train.compile is True and width >= cfg.data.max_len and width % 64 == 0
    assert gpu.train.max_tokens // (2 * width) >= 1  # at least one row a block
    assert said is not None and "compiled" in said and f"{width} positions wide" in said
    cpu, said = for_device(cfg, CPU)
    assert cpu.train.compile is False and cpu.train.pack_width == 0 and said is None
    # what the user wrote is kept apart from what a device decides
    assert cfg.train.compile == "auto" and cfg.train.pack_width == "auto"


def test_a_compile_asked_for_on_a_cpu_is_announced():
    """train.compile true on a CPU compiles for minutes in the first updates: said up front."""
    cfg = load_config(ROOT / "configs/multi30k_en_de.yaml", ["train.compile=true"])
    cpu, said = for_device(cfg, CPU)
    assert cpu.train.compile is True and "compiled (train.compile true)" in said
    assert "a minute or more while it compiles" in said


@pytest.mark.parametrize(
    "sets,compiled,packed",
    [
        (["train.rdrop_alpha=0.5"], False, False),  # R-Drop's step stays eager
        (["train.data_parallel=ddp"], False, False),  # DDP splits a compiled step
        (["train.compile=false"], False, False),  # packing only serves the compiled step
        (["train.pack_width=0"], True, False),
        (["train.shape_buckets=16"], True, False),  # the user's other way to few shapes
        (["train.compile=true", "train.pack_width=256"], True, True),  # as given
        (["model.arch=decoder_only"], True, False),  # packing is the Transformer's
    ],
)
def test_auto_packs_a_compiled_plain_step_alone(sets, compiled, packed):
    cfg = load_config(ROOT / "configs/multi30k_en_de.yaml", sets)
    t = for_device(cfg, CUDA)[0].train
    assert t.compile is compiled and bool(t.pack_width) is packed


@pytest.fixture(scope="module")
def test_set_translator():
    """The 1,000 Multi30k test sentences and a Translator that takes the GPU's route on the
    CPU (the search on the device, the compiled step over a static cache), with a small
    untrained model (its outputs run to their length limits: the most shapes) and a BPE model
    of the real text."""
    import gzip

    from mt.config import DecodeConfig
    from mt.data.tokenizer import Tokenizer, train_bpe
    from mt.decode.translator import Translator
    from mt.model import LayerShape, Transformer
    from tests.conftest import MULTI30K

    if not (MULTI30K / "test_2016_flickr.en.gz").is_file():
        pytest.skip("real Multi30k not found at ../shared/data/multi30k")

    def read(name):
        with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as f:
            return f.read().splitlines()

    train = read("train.en.gz")[:4000] + read("train.de.gz")[:4000]
    tokenizer = Tokenizer(train_bpe(train, 1000))
    torch.manual_seed(0)
    shape = LayerShape(d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    model = Transformer(
        src_vocab=1000,
        tgt_vocab=1000,
        shape=shape,
        enc_layers=1,
        dec_layers=1,
        tie_embeddings="all",
        max_positions=256,
    ).eval()
    cfg = DecodeConfig(compile_step="always", device_search="always")
    return read("test_2016_flickr.en.gz"), Translator(model, tokenizer, cfg, CPU)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_test_set_on_the_gpus_route_compiles_the_step_at_most_twice(
    test_set_translator, backend
):
    """Every batch size, source length and cache room of the job share one compiled step
    (Dynamo's graphs counted, no kernels made; aot_eager also traces them through AOTAutograd
    as Inductor would, where guards of its own could add recompiles): beam 5 compiles once,
    greedy search (one cross-attention row per hypothesis) once more, and beam 5 again
    nothing."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from mt.decode.step import CompiledStep

    lines, translator = test_set_translator
    torch._dynamo.reset()
    counters.clear()
    translator._compiled = CompiledStep(CPU, backend=backend)
    shapes = set()
    step_fn = translator._compiled.fn

    def seen(model, tokens, memory, pad_mask, cache, position):
        shapes.add((tokens.shape[0], memory.shape[1], cache[0].self.k.shape[2]))
        return step_fn(model, tokens, memory, pad_mask, cache, position)

    translator._compiled.fn = seen
    graphs = []
    for beam in (5, 1, 5):
        translator.search(lines, beam=beam)
        graphs.append(counters["stats"]["unique_graphs"])
    assert len(shapes) >= 20 and graphs == [1, 2, 2], (graphs, len(shapes))
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_the_decoder_compiles_where_the_job_repays_its_cold_or_warm_price(
    tmp_path, monkeypatch, capsys
):
    """decode.compile_step auto on a GPU: a job compiles where its steps' savings repay the
    compile, at the cold price until this cache holds the step (marked after its first
    compiled call), then at the warm one; the line before the compile says which it assumed.
    A CPU never compiles on auto; always and never are as given."""
    from mt.decode import step as steps_mod
    from mt.decode.step import (
        COLD_COMPILE_S,
        SAVED_PER_STEP_S,
        WARM_COMPILE_S,
        CompiledStep,
        announce_compile,
        compile_pays,
        compiled_marker,
    )

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB")
    cold, warm = COLD_COMPILE_S / SAVED_PER_STEP_S, WARM_COMPILE_S / SAVED_PER_STEP_S
    assert warm < cold
    assert compile_pays("auto", CUDA, cold) and not compile_pays("auto", CUDA, cold - 1)
    assert not compile_pays("auto", CUDA, warm) and not compile_pays("auto", CPU, 1e9)
    assert compile_pays("always", CPU, 1) and not compile_pays("never", CUDA, 1e9)
    announce_compile(CUDA, "auto", cold)
    assert f"repays a cold compile, assumed {COLD_COMPILE_S:g} s" in capsys.readouterr().err

    # a compiled call that falls back to the eager step marks nothing; one that ran does
    compiled = CompiledStep(CPU, backend="eager", warn=lambda message: None)
    compiled.unmarked = compiled_marker(CUDA)
    compiled.fn = lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel"))
    monkeypatch.setattr(steps_mod, "decoder_step", lambda *a: torch.zeros(1))
    compiled()
    assert not compiled_marker(CUDA).exists()
    compiled.fn, compiled.unmarked = (lambda *a: torch.ones(1)), compiled_marker(CUDA)
    compiled()
    assert compiled_marker(CUDA).is_file() and compiled.unmarked is None
    assert compile_pays("auto", CUDA, warm) and not compile_pays("auto", CUDA, warm - 1)
    announce_compile(CUDA, "auto", warm)
    assert f"repays a warm compile, assumed {WARM_COMPILE_S:g} s" in capsys.readouterr().err
