"""The device update (step.py) captured whole as one CUDA graph (train.update: graph).

A small model's update on a GPU is bound by the host: the device finishes its kernels in about
a millisecond while Python walks the compiled step's guards, autograd's bookkeeping, the
gradients' copy into the flat buffers, the settle and Adam. Here all of it (forward, backward,
the copy, settle and fused Adam) is recorded once as a CUDA graph and then replayed with one
call per update (Nvidia's "whole-network capture"; torch.cuda.graph). What changes from update
to update lives in tensors the graph reads, written before each replay:

- the batch: copied into static buffers of the one shape packed blocks have (train.pack_width);
- the learning rate: a 0-dim tensor Adam reads (mt/train/update/optim.py), filled from the schedule;
- the update's target tokens, which settle divides by (the exchange's own tensor).

Dropout draws new masks at every replay: PyTorch's CUDA generator gives a captured graph a
fresh offset each time. A non-finite update is skipped on the device, as in the device update
(a found-inf flag Adam reads); running out of memory can only happen before the capture (a
replay allocates nothing): an update that does is skipped, and a capture that does ends the
run, saying what to lower. The first WARMUP updates run uncaptured (and on a CPU every update
does, the same code with nothing recorded: tests/test_step.py compares it with the device
update), which also lets autograd, cuBLAS and the compiled kernels make what they make once.
"""

from __future__ import annotations

import torch

from mt.data.batching import Batch
from mt.errors import MTError, first_line
from mt.train.state import TrainState
from mt.train.update.step import DeviceUpdate, forward

# updates run uncaptured before the capture: the compiles, autograd's and cuBLAS's first calls,
# and Adam's state are made there, outside the graph
WARMUP = 3


class GraphUpdate(DeviceUpdate):
    """The device update of one process, recorded: exchange: exchange.py's Flat; optimizer:
    mt.train.update.optim.Adam; scaler: the run's GradScaler (disabled: resolve_update refuses
    fp16); scheduler and ema: what a skip found late is taken back from (DeviceUpdate.settle;
    ema None: no weight average); capture: record and replay (a GPU), else every update runs
    as recorded would."""

    copies_batches = True  # (into its static buffers: a batch of slices will do)

    def __init__(self, *parts, capture: bool):
        """parts: DeviceUpdate's (its dist one process: resolve_update refuses ranks)."""
        super().__init__(*parts)
        self.capture = capture
        self.lr = torch.zeros((), dtype=torch.float32, device=self.device)  # what Adam reads
        self.static: Batch | None = None  # the batch buffers the graph reads
        self.graph: torch.cuda.CUDAGraph | None = None
        self.row: torch.Tensor | None = None  # the graph's log row (written by each replay)
        self.uncaptured = 0  # updates made before the capture

    def __call__(self, batches: list[Batch], state: TrainState) -> torch.Tensor | None:
        """One update from `batches` (one batch): its log row, a copy (the next replay writes
        over the graph's), or None when it ran out of memory before the capture."""
        (batch,) = batches
        self._load(batch)
        self.exchange.begin(batch.n_tokens)  # (its token count, which settle divides by)
        self.lr.fill_(self.optimizer.param_groups[0]["lr"])
        if self.graph is None and self.capture and self.uncaptured >= WARMUP:
            self.graph = self._capture(state)
        if self.graph is not None:
            self.graph.replay()
        else:
            try:
                self.row = self._update()
            except torch.OutOfMemoryError:
                return self._out_of_memory(state, batch)
            self.uncaptured += 1
        assert self.skips.deferred is not None and self.row is not None
        self.skips.deferred.updates += 1
        return self.row.clone()

    def _update(self) -> torch.Tensor:
        """The work the graph holds: forward and backward of the static batch, its gradients
        into the flat buffers, settle (divided, clipped, a skip flagged) and Adam with the
        device's learning rate. Returns the log row (zeros when skipped)."""
        assert self.static is not None and self.skips.deferred is not None
        loss, nll = forward(self.model, self.loss, self.static, self.device, self.amp_dtype)
        self.exchange.backward(loss, nll, self.scaler)
        found_inf, kept, row, scale = self.exchange.finish(
            self.skips.deferred.count, self.clip_norm
        )
        self.optimizer.step(found_inf=found_inf, kept=kept, grad_scale=scale, lr=self.lr)
        return row

    def _capture(self, state: TrainState) -> torch.cuda.CUDAGraph:
        """The update recorded (not run: the replay that follows runs it)."""
        assert self.static is not None
        graph = torch.cuda.CUDAGraph()
        try:
            # (on a stream of its own, memory of its own; the batches' thread may pin memory
            # meanwhile, which only this thread's capture must not do)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.row = self._update()
        except torch.OutOfMemoryError:
            blocks = "x".join(map(str, self.static.src.shape))
            raise MTError(
                f"step {state.step}: the update's CUDA graph does not fit the GPU's memory "
                f"(blocks {blocks}): lower train.max_tokens, or set train.update: device"
            ) from None
        except RuntimeError as e:  # (something in the update the device cannot record)
            first = first_line(e)
            raise MTError(
                f"step {state.step}: the update could not be recorded as a CUDA graph "
                f"({first}); set train.update: device"
            ) from e
        return graph

    def _load(self, batch: Batch) -> None:
        """`batch` copied into the static buffers (made from the first batch); every batch
        of a packed run has their shape."""
        if self.static is None:
            self.static = Batch.of_tensors([t.clone() for t in batch.tensors()], batch.n_tokens)
            return
        if batch.src.shape != self.static.src.shape:
            raise MTError(
                f"train.update graph replays blocks of {list(self.static.src.shape)}; a batch "
                f"of {list(batch.src.shape)} came: set train.update: device"
            )
        torch._foreach_copy_(self.static.tensors(), batch.tensors(), non_blocking=True)
