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
