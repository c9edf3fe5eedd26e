"""The device and precision choices: what a GPU would be given, reached on the CPU by patching
its capabilities; what decoding computes in."""

import pytest
import torch

from mt.artifacts import checkpoint
from mt.errors import MTError
from mt.runtime.device import amp_dtype, decode_dtype


def test_choosing_a_gpu_turns_cudnn_attention_off(monkeypatch):
    """cuDNN's attention plans each new shape (468 ms against 61 for a first-seen batch
    shape on an H200, docs/gpu.md): choosing a CUDA device leaves SDPA to its other kernels."""
    from mt.runtime.device import pick_device

    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert pick_device("cpu").type == "cpu" and torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert pick_device("auto").type == "cuda"
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert (
            torch.backends.cuda.flash_sdp_enabled()
            and torch.backends.cuda.mem_efficient_sdp_enabled()
        )
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


@pytest.mark.parametrize(
    "capability,expected",
    [
        ((7, 0), torch.float16),
        ((7, 5), torch.float16),
        ((8, 0), torch.bfloat16),
        ((9, 0), torch.bfloat16),
    ],
)
def test_auto_precision_uses_fp16_on_gpus_without_native_bf16(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulation
    assert amp_dtype("auto", torch.device("cuda")) is expected
    assert amp_dtype("auto", torch.device("cpu")) is None


def test_decoding_precision_follows_the_checkpoint_and_the_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert decode_dtype("auto", "fp32", cuda) is None  # trained in fp32: fp32
    assert decode_dtype("auto", "bf16", cuda) is torch.bfloat16
    assert decode_dtype("auto", "fp16", cuda) is torch.float16
    assert decode_dtype("auto", "bf16", cpu) is None  # CPU: fp32
    assert decode_dtype("fp32", "bf16", cuda) is None  # the flag wins
    with pytest.raises(MTError, match="--precision 'half'"):
        decode_dtype("half", "fp32", cpu)


def test_decoding_auto_follows_the_precision_the_run_really_trained_in(tiny_run, monkeypatch):
    """train.precision "auto" is recorded as what it resolved to: a run trained on a CPU
    computed in fp32 and is decoded in fp32 on a GPU too (decoding it in bf16 on an H100
    changed 39 of 1,000 test translations); checkpoints without the record fall back to the
    config, as before."""
    from mt.runtime.device import PRECISION_NAMES

    # tiny_run trained in an `mt` subprocess, and those see no GPU (conftest.cli_env), so on
    # every machine it trained on the CPU
    ran_in = PRECISION_NAMES[amp_dtype("auto", torch.device("cpu"))]
    assert ran_in == "fp32"
    for name in ["best.pt", "last.pt"]:
        ckpt = checkpoint.load(tiny_run / name)
        assert ckpt["config"]["train"]["precision"] == "auto"
        assert checkpoint.trained_precision(ckpt) == ran_in, name
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    cuda = torch.device("cuda")
    assert decode_dtype("auto", "fp32", cuda) is None
    del ckpt["train_state"]["precision"]  # a checkpoint from before the record
    assert checkpoint.trained_precision(ckpt) == "auto"
    assert decode_dtype("auto", checkpoint.trained_precision(ckpt), cuda) is torch.bfloat16


def test_output_layer_and_log_softmax_are_fp32_under_autocast():
    from mt.config import ModelConfig
    from mt.decode.step import decoder_step
    from mt.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64), 50, 50).eval()
    src = torch.randint(4, 50, (3, 6))
    mask = src == 0
    tokens = torch.full((3, 1), 2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory = model.encode(src, mask)
        h = model.decode(tokens, memory, mask)
        lprobs = decoder_step(model, tokens, memory, mask, None, 0)
    assert lprobs.dtype == torch.float32
    with torch.no_grad():
        exact = torch.log_softmax(model.project(h[:, -1].float()), -1)
    ok = torch.isfinite(lprobs)
    torch.testing.assert_close(lprobs[ok], exact[ok], rtol=0, atol=1e-5)


def test_host_syncs_count_every_read_of_a_tensors_values():
    from mt.runtime.host_syncs import HostSyncs

    x = torch.arange(6.0)
    reads = [
        lambda: x.item() if x.numel() == 1 else x[0].item(),
        lambda: x.tolist(),
        lambda: bool(x[0]),
        lambda: int(x[1]),
        lambda: float(x[2]),
        lambda: x.nonzero(),
        lambda: x[x > 2],
        lambda: x.masked_select(x > 2),
        lambda: x.cpu(),
        lambda: x.numpy(),
        lambda: x.to("cpu"),
        lambda: x.to(device="cpu"),
        lambda: x.__setitem__(0, 0.0),  # t[i] = 0.0: a number copied from the host
        lambda: x.__setitem__((slice(None),), 1),
        lambda: x.__setitem__([1, 2], 0.0),  # t[[1, 2]] = 0.0: the list copied from the host
        lambda: x[[0, 3]],
    ]
    for i, read in enumerate(reads):
        with HostSyncs() as syncs:
            read()
        assert syncs.count == 1, (i, syncs.count)
    with HostSyncs() as syncs:  # none of these waits for a device
        x.to(torch.float64), x + 1, x.sum(), x[1:3], x.to(x.device)
        x[0:1].fill_(0.0), x.__setitem__(torch.tensor([1, 2]), 0.0), x.__setitem__(0, x[1])
    assert syncs.count == 0, syncs.where
