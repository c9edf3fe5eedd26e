"""Which optimizer update a run makes. `resolve_update` is the one reader of train.update,
with every refusal, called before the data and the model are made; `build_update` makes the
update it chose, with its Skips and its loss (compiled where train.compile says). The kinds:
mt/train/update/step.py's PlainUpdate (one CPU process) and DeviceUpdate (a GPU, or ranks), and
mt/train/update/graphed.py's GraphUpdate (the device update as one CUDA graph)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mt.data.batching import Batch
from mt.errors import MTError
from mt.runtime.distributed import Dist
from mt.train.state import TrainState
from mt.train.update.compiled import compiled_step
from mt.train.update.exchange import build_exchange, ddp_objective
from mt.train.update.graphed import GraphUpdate
from mt.train.update.skips import Skips
from mt.train.update.step import DeviceUpdate, PlainUpdate


class Update(Protocol):
    """What every kind of update provides to the Trainer."""

    # whether it copies each batch into buffers of its own (the batch walk may then hand
    # out slices of the corpus, not fresh tensors)
    copies_batches: bool

    def __call__(self, batches: list[Batch], state: TrainState) -> torch.Tensor | None:
        """One optimizer update from `batches` (gradient accumulation): its log row (the loss
        and NLL sums, the target tokens) on the device, or None where it was skipped at once;
        the schedule, the step count and the weight average are the Trainer's."""
        ...

    def settle(self, state: TrainState) -> None:
        """Take the updates skipped on the device since the host's last read back off the
        step count, the schedule and the weight average (nothing where every skip is known
        at once)."""
        ...


def resolve_update(cfg, device: torch.device, dist: Dist, fp16: bool) -> str:
    """train.update resolved: "plain", "device" or "graph" (auto: device on a GPU or with
    ranks, plain in one CPU process, for fp16, whose GradScaler reads the host, and for
    train.data_parallel ddp, which rides in the plain update), every setting it cannot make
    refused in one line. cfg: the train section as resolved for the device
    (parts.for_device); fp16: whether the run computes in fp16 (a GradScaler)."""
    setting, ddp = cfg.update, dist.enabled and cfg.data_parallel == "ddp"
    if setting == "graph" and dist.enabled:
        raise MTError(
            "train.update: graph trains one process; under torchrun set train.update to auto "
            "or device"
        )
    if setting == "plain" and dist.enabled and not ddp:
        raise MTError(
            "train.update: plain exchanges the ranks' gradients through PyTorch's DDP: set "
            "train.data_parallel: ddp, or train.update: auto"
        )
    if setting == "device" and (fp16 or ddp):
        why = "fp16's GradScaler reads the host" if fp16 else "DDP exchanges in its own hooks"
        raise MTError(
            f"train.update: device skips on the device, and {why}: set train.update to auto "
            f"or plain"
        )
    kind = setting
    if setting == "auto":
        on_device = (device.type == "cuda" or dist.enabled) and not (fp16 or ddp)
        kind = "device" if on_device else "plain"
    refusal = _graph_refusal(cfg, fp16) if kind == "graph" else None
    if refusal:
        raise MTError(refusal)
    return kind


def _graph_refusal(cfg, fp16: bool) -> str | None:
    """Why train.update graph cannot make this run's update, or None."""
    if fp16:
        return "train.update graph skips on the device; fp16's GradScaler reads it: use bf16"
    if cfg.accum_steps != 1:
        return "train.update graph captures one batch's update: set train.accum_steps: 1"
    if not cfg.pack_width:
        return "train.update graph replays one batch shape: set train.pack_width (e.g. 128)"
    return None


def build_update(t, compile: bool | None) -> tuple[Update, Skips, bool, Any]:
    """(the update train.update chose for the Trainer `t`'s model, optimizer, schedule,
    scaler, weight average and ranks; its Skips; whether the compiled step replays CUDA
    graphs; the compiled loss or None). Each shape's step runs through CUDA graphs for the
    device update alone (compiled_step); the graph update records the whole update."""
    kind = resolve_update(t.cfg, t.device, t.dist, t.scaler.is_enabled())
    cuda_graphs, compiled_loss = compiled_step(
        t.objective, t.cfg, compile, t.device, graphs=kind == "device"
    )
    cfg, loss = t.cfg, compiled_loss or t.objective.loss
    skips = Skips(t.device, kind != "plain", cfg.max_nonfinite, t.write_log)
    if kind == "plain":
        return _plain(t, loss, skips), skips, cuda_graphs, compiled_loss
    exchange = build_exchange(cfg, t.optimizer, t.dist, compiled_loss is not None)
    parts: tuple[Any, ...] = (t.model, loss, exchange, t.optimizer, t.scheduler, t.scaler)
    parts += (t.ema, skips, cfg.clip_norm, t.dist, t.device, t.amp_dtype)
    if kind == "graph":  # (on a CPU, every update runs as recorded)
        graphed = GraphUpdate(*parts, capture=t.device.type == "cuda")
        return graphed, skips, cuda_graphs, compiled_loss
    return DeviceUpdate(*parts), skips, cuda_graphs, compiled_loss


def _plain(t, loss, skips: Skips) -> PlainUpdate:
    """The plain update of the Trainer `t`, its objective under DDP where the ranks exchange
    through it (train.data_parallel ddp)."""
    ddp = None
    if t.dist.enabled:
        masked_lm = t.state.objective == "masked_lm"  # (leaves the decoder without gradients)
        ddp = ddp_objective(t.model, loss, t.cfg.ddp_bucket_mb, find_unused=masked_lm)
    parts = (t.model, loss, t.optimizer, t.scaler, t.cfg.clip_norm, skips, t.device)
    return PlainUpdate(*parts, t.amp_dtype, t.dist, ddp)
