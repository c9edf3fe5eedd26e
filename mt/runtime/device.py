"""Which device and which autocast precision a run, or a decoding, uses."""

from __future__ import annotations

import torch

from mt.errors import MTError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# each explicit precision's autocast dtype (None: plain fp32), and back
AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISION_NAMES = {dtype: name for name, dtype in AMP_DTYPES.items()}


def pick_device(name: str, setting: str = "train.device") -> torch.device:
    """The device `name` (auto, cpu, cuda) asks for; `setting`: the key or flag that named it,
    for the message when no GPU is visible."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        fix = "--device auto or cpu" if setting.startswith("--") else f"{setting}: auto or cpu"
        raise MTError(f"{setting} is {name} but no CUDA GPU is visible; use {fix}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        avoid_cudnn_attention()
    return device


def avoid_cudnn_attention() -> None:
    """Keep scaled_dot_product_attention off cuDNN's kernels (flash and memory-efficient
    attention remain). cuDNN builds an execution plan for every new tensor shape, and NMT
    meets new shapes all the time: variable-length batches, and every step of incremental
    decoding grows the keys by one: each first sight of a shape costs a plan, many times the
    step itself (scripts/bench/gpu_shape_probe.py; figures in docs/gpu.md)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def native_bf16(device: torch.device) -> bool:
    """bf16 tensor cores: Ampere (compute capability 8.0) and later. torch's
    is_bf16_supported() also counts emulation, which is slower than fp16 on a V100 or T4."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision` on `device`; None means plain fp32. "auto": bf16
    where the GPU has it natively, fp16 (with loss scaling in training) on older GPUs, fp32 on
    CPU (where autocast is slower than fp32)."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return AMP_DTYPES[precision]


def fp32_matmuls(device: torch.device, dtype: torch.dtype | None) -> None:
    """On a GPU under a bf16 or fp16 autocast (`dtype`), the matrix products that stay fp32
    (decoding's output layer and log-softmax, what autocast keeps fp32) run on TF32 tensor
    cores: 10 bits of mantissa against bf16's 7, with fp32 sums. A run or decoding in fp32
    (dtype None) keeps full fp32. A CPU has no TF32: nothing changes."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if dtype is not None else "highest")


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The run's autocast around a forward pass (dtype None: plain fp32, no autocast)."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def decode_dtype(requested: str, trained: str, device: torch.device) -> torch.dtype | None:
    """Decoding precision: "auto" follows the precision the run trained in on a GPU (a run
    trained in fp32, e.g. on a CPU, is decoded in fp32; see checkpoint.trained_precision) and
    is fp32 on CPU; anything else is taken as asked."""
    if requested not in PRECISIONS:
        raise MTError(f"--precision {requested!r}: use one of {', '.join(PRECISIONS)}")
    if requested == "auto":
        return amp_dtype(trained, device) if device.type == "cuda" else None
    return amp_dtype(requested, device)
