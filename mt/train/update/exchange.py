"""How the device update's gradients and sums (mt/train/update/step.py) become every rank's: the two
ways of data parallelism (train.data_parallel), and the one process on a GPU, which is the
first of them with one rank.

`Flat` (the default, and one process): every trained parameter's gradient is a view into a
persistent flat buffer, one per dtype. An update's first backward pass copies its gradients
and its loss sums into the buffers, the next ones add theirs, each with one foreach kernel for
all of them. After the last, one in-place all-reduce per buffer exchanges the gradients
together with four numbers that ride at the end of the float32 buffer: whether the rank ran
out of memory, its loss and NLL sums, and its target tokens. The gradients are then divided
by the global token count on the device and clipped (`settle`, one graph under
train.compile), and a skipped update (out of memory on any rank, a loss that is not finite) is
skipped by Adam on the device: nothing is read by the host, no copy is made, and an
out-of-memory batch on one rank is skipped by all (they all reach the all-reduce). Nothing
overlaps the backward pass.

`DDP`: torch's DistributedDataParallel around one module whose forward is the whole objective
(model plus loss), its bucketed all-reduces overlapping the backward pass. A rank that runs
out of memory cannot skip its batch alone (the others would wait in DDP's all-reduces), so it
ends the run, saying so.

Both normalise as one process would with the ranks' batches together: every gradient is the
sum of the token losses' gradients over all ranks and micro-batches, divided by the global
number of target tokens.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mt.data.batching import Batch
from mt.errors import MTError
from mt.runtime.distributed import Dist

# the numbers after the gradients in the float32 buffer
OUT_OF_MEMORY, LOSS, NLL, TOKENS = range(4)


@dataclass(frozen=True)
class Sums:
    """An update's sums over every rank, as 0-dim tensors on the device: out_of_memory > 0
    when any rank ran out of memory; the loss and NLL summed over target tokens; tokens."""

    out_of_memory: torch.Tensor
    loss: torch.Tensor
    nll: torch.Tensor
    tokens: torch.Tensor


def settle(
    flats: list[torch.Tensor],
    counts: torch.Tensor | None,
    hint: float,
    clip_norm: float,
    fold: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What follows the exchange, on the device, as one graph where train.compile is on.
    flats: Flat's buffers, the float32 one first (the gradients, then its four numbers);
    counts: DeferredSkips' (skipped, out of memory) counts, added to; hint: the tokens the
    backward passes divided by; clip_norm: train.clip_norm (0: none).
    The gradients are to be multiplied by hint / the update's tokens, so that they are the
    gradient of the mean token loss, and clipped as torch.nn.utils.clip_grad_norm_ clips (the
    norm of all of them, taken once per buffer). fold: that factor is left to fused Adam, which
    divides by its `grad_scale` as it reads each gradient (a pass over the buffers fewer); else
    the gradients are multiplied here. Returns Adam's found-inf flag (1.0: skip the update),
    1 - it, the log window's row (loss sum, NLL sum, tokens; zeros when skipped) and, folded,
    the grad_scale (None when the gradients were multiplied)."""
    extras = flats[0][-4:]
    out_of_memory = extras[OUT_OF_MEMORY] > 0
    skip = (out_of_memory | ~torch.isfinite(extras[LOSS])).float()
    if counts is not None:
        counts.add_(torch.stack([skip, out_of_memory.float()]))
    row = torch.where(skip > 0, 0.0, extras[LOSS:])  # (a where: NaN times 0 is NaN)
    grads = [flats[0][:-4], *flats[1:]]
    factor = hint / extras[TOKENS]
    if clip_norm > 0:
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
        norm = factor * torch.linalg.vector_norm(torch.stack(norms))
        factor = factor * (clip_norm / (norm + 1e-6)).clamp(max=1.0)
    extras[OUT_OF_MEMORY : OUT_OF_MEMORY + 1].zero_()  # (a kernel: no number from the host)
    if fold:
        return skip, 1.0 - skip, row, 1.0 / factor
    for g in grads:
        g.mul_(factor.to(g.dtype))
    return skip, 1.0 - skip, row, None


class Flat:
    """params: what the optimizer trains. tokens_hint: a number of target tokens the same on
    every rank, about an update's over all ranks; each backward pass takes its loss divided by
    it, which keeps fp16 activations' gradients at the scale of a per-token loss, and the
    exchanged gradients are multiplied by tokens_hint / (the global tokens) afterwards.
    compiled: settle as one compiled graph (train.compile)."""

    skips_out_of_memory = True  # (every rank reaches the all-reduce)

    def __init__(
        self, params, dist: Dist, device: torch.device, tokens_hint: int, compiled: bool = False
    ):
        self.dist, self.device, self.tokens_hint = dist, device, tokens_hint
        params = [p for p in params if p.requires_grad]
        by_dtype: dict[torch.dtype, list] = {torch.float32: []}  # (the sums ride in float32)
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self.flats: list[torch.Tensor] = []  # one buffer per dtype
        for dtype, group in by_dtype.items():
            n = sum(p.numel() for p in group)
            flat = torch.zeros(n + 4 * (dtype == torch.float32), dtype=dtype, device=device)
            self.flats.append(flat)
            if dtype == torch.float32:
                self.extras = flat[n:]
            offset = 0
            for p in group:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self.params = params
        self.views = [p.grad for p in params]
        # (views made once: each is an operator of its own)
        self.sum_views = [self.extras[LOSS], self.extras[NLL]]
        self.tokens = self.extras[TOKENS]
        # the backward passes' output gradient: the loss divided by the hint
        self.grad_output = torch.full((), 1.0 / tokens_hint, device=device)
        self.written = False  # whether a backward pass of this update wrote the gradients
        self.settle = torch.compile(settle, fullgraph=True, dynamic=False) if compiled else settle

    def begin(self, n_tokens: int) -> None:
        """An update of `n_tokens` target tokens (this rank's) begins: its first backward pass
        writes over the gradients (no zeroing kernel)."""
        self.written = False
        self.tokens.fill_(float(n_tokens))  # (a fill: no copy from the host)

    def backward(self, loss: torch.Tensor, nll: torch.Tensor, scaler) -> None:
        """The gradients of `loss` / tokens_hint (times fp16's loss scale) and the loss and NLL
        sums, added into the buffers by one foreach kernel for all of them (a copy for the
        update's first pass), where autograd would add each parameter's on its own."""
        out = scaler.scale(loss) if scaler.is_enabled() else loss
        grads = torch.autograd.grad(
            out, self.params, grad_outputs=self.grad_output, allow_unused=True
        )
        views = [v for v, g in zip(self.views, grads, strict=True) if g is not None]
        news = [g for g in grads if g is not None]
        into, values = views + self.sum_views, [*news, loss.detach(), nll.detach()]
        if self.written:
            torch._foreach_add_(into, values)
        else:
            unused = [v for v, g in zip(self.views, grads, strict=True) if g is None]
            if unused:
                torch._foreach_zero_(unused)
            torch._foreach_copy_(into, values)
        self.written = True

    def wrap(self, loss: Callable) -> Callable:
        """The step's loss(model, batch) (the objective's, or its compiled form)."""
        return loss

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def reduce(self, out_of_memory: bool) -> None:
        """After the update's last backward pass: the buffers summed over the ranks."""
        if out_of_memory:  # (whatever the failed pass left is applied by no one)
            self.extras[OUT_OF_MEMORY].fill_(1.0)
        if self.dist.enabled:
            with self.dist.together("the exchange of gradients"):
                for flat in self.flats:
                    torch.distributed.all_reduce(flat)

    def sums(self) -> Sums:
        """The update's Sums, a copy (the next update writes over the buffer)."""
        return Sums(*self.extras.clone().unbind())

    def finish(self, counts: torch.Tensor | None, clip_norm: float, fold: bool = True) -> tuple:
        """(found_inf, 1 - found_inf, log row, grad_scale): settle(); fold False: the
        gradients multiplied here (fp16's GradScaler steps Adam itself), grad_scale None."""
        return self.settle(self.flats, counts, float(self.tokens_hint), clip_norm, fold)

    def clip_grad_norm_(self, max_norm: float) -> None:
        """torch.nn.utils.clip_grad_norm_ (for fp16, whose GradScaler unscales first)."""
        torch.nn.utils.clip_grad_norm_(self.params, max_norm)


class DDP:
    """torch.nn.parallel.DistributedDataParallel around the objective; bucket_mb: the size of
    its gradient buckets; find_unused: the objective leaves parameters without a gradient
    (the masked-LM pretraining of the encoder leaves the decoder)."""

    skips_out_of_memory = False

    def __init__(
        self, model, loss: Callable, dist: Dist, bucket_mb: float, find_unused: bool = False
    ):
        from torch.nn.parallel import DistributedDataParallel

        self.dist, self.model = dist, model
        with warnings.catch_warnings():  # (its successor, forward_sync_buffers, still syncs)
            warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated")
            self.wrapped = DistributedDataParallel(
                _Objective(model, loss),
                bucket_cap_mb=bucket_mb,
                gradient_as_bucket_view=True,  # the buckets are the gradients: no copy
                find_unused_parameters=find_unused,
                broadcast_buffers=False,  # the model's buffers are constants: none each step
            )
        self.tokens = torch.zeros(())
        self.scale = torch.ones(())
        self.losses: list[torch.Tensor] = []
        self.nlls: list[torch.Tensor] = []
        self.summed = torch.zeros(2)

    def begin(self, n_tokens: int) -> None:
        """The gradients zeroed; world / the global token count (DDP divides by world),
        summed on the device before the backward passes that need it."""
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        device = next(self.model.parameters()).device
        self.tokens = self.dist.sum(torch.full((), float(n_tokens), device=device))
        self.scale = self.dist.world / self.tokens
        self.losses, self.nlls = [], []

    def backward(self, loss: torch.Tensor, nll: torch.Tensor, scaler) -> None:
        (scaler.scale(loss) * self.scale).backward()  # (DDP's hooks exchange as it goes)
        self.losses.append(loss.detach())
        self.nlls.append(nll.detach())

    def wrap(self, loss: Callable) -> Callable:
        """Through DDP's forward, which the exchange in the backward pass needs (the
        objective's own loss: train.compile is refused with ddp)."""
        return lambda model, batch: self.wrapped(batch)

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Accumulation: the ranks exchange in the last micro-batch's backward only."""
        return contextlib.nullcontext() if last else self.wrapped.no_sync()

    def reduce(self, out_of_memory: bool) -> None:
        assert not out_of_memory  # (ended the run: Trainer._backward)
        losses = torch.stack([torch.stack(self.losses).sum(), torch.stack(self.nlls).sum()])
        self.summed = self.dist.sum(losses)

    def sums(self) -> Sums:
        return Sums(torch.zeros_like(self.tokens), self.summed[0], self.summed[1], self.tokens)

    def finish(self, counts: torch.Tensor | None, clip_norm: float, fold: bool = True) -> tuple:
        """(found_inf, 1 - found_inf, log row, None), as settle() gives them; the gradients
        clipped (DDP divided them already: nothing is left to fold)."""
        loss, nll = self.summed.unbind()
        skip = (~torch.isfinite(loss)).float()
        if counts is not None:
            counts.add_(torch.stack([skip, torch.zeros_like(skip)]))
        row = torch.where(skip > 0, 0.0, torch.stack([loss, nll, self.tokens]))
        if clip_norm > 0:
            self.clip_grad_norm_(clip_norm)
        return skip, 1.0 - skip, row, None

    def clip_grad_norm_(self, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)


class _Objective(torch.nn.Module):
    """The objective as one module, for DDP: forward(batch) -> (loss, nll) of the model."""

    def __init__(self, model, loss: Callable):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, batch: Batch):
        return self.loss(self.model, batch)


def out_of_memory_under_ddp(rank: int, step: int, batches: list[Batch]) -> MTError:
    tokens = sum(b.n_tokens for b in batches)
    shape = "x".join(map(str, batches[0].src.shape))
    return MTError(
        f"rank {rank} ran out of memory at step {step} on batches of {tokens} target tokens "
        f"(source {shape}); under train.data_parallel: ddp that ends the run on every rank "
        f"(the others would wait for it in DDP's all-reduce): lower train.max_tokens, or use "
        f"train.data_parallel: flat, which skips such a batch on every rank"
    )


def build_exchange(
    cfg, model, optimizer, loss: Callable, dist: Dist, find_unused: bool, compiled: bool = False
):
    """The exchange train.data_parallel names (cfg: the train config); one process: Flat.
    compiled: its bookkeeping after the exchange as one compiled graph (train.compile)."""
    if dist.enabled and cfg.data_parallel == "ddp":
        return DDP(model, loss, dist, cfg.ddp_bucket_mb, find_unused)
    params = optimizer.param_groups[0]["params"]
    device = params[0].device
    hint = dist.world * cfg.accum_steps * cfg.max_tokens
    return Flat(params, dist, device, hint, compiled=compiled)
