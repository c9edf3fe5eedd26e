"""How an update's gradients and sums become every rank's: the two ways of data parallelism
(train.data_parallel), and the one process, which is the first of them with one rank.

`Flat` (the default, and one process): every trained parameter's gradient is a view into a
persistent flat buffer, one per dtype, that the backward passes add into. After the last
backward of an update, one in-place all-reduce per buffer exchanges the gradients together
with four numbers that ride at the end of the float32 buffer: whether the rank ran out of
memory, its loss and NLL sums, and its target tokens. The gradients are then divided by the
global token count on the device, and a skipped update (out of memory on any rank, a loss
that is not finite) is skipped by Adam on the device: nothing is read by the host, no copy is
made, and an out-of-memory batch on one rank is skipped by all (they all reach the
all-reduce). Nothing overlaps the backward pass.

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

    @property
    def skip(self) -> torch.Tensor:
        """1.0 where the update must not be applied (Adam's found-inf flag), else 0.0."""
        return ((self.out_of_memory > 0) | ~torch.isfinite(self.loss)).float()


class Flat:
    """params: what the optimizer trains. tokens_hint: a number of target tokens the same on
    every rank, about an update's over all ranks; each backward pass takes its loss divided by
    it, which keeps fp16 activations' gradients at the scale of a per-token loss, and the
    exchanged gradients are multiplied by tokens_hint / (the global tokens) afterwards. One
    process divides by its own token count instead, as one process always has."""

    skips_out_of_memory = True  # (every rank reaches the all-reduce)

    def __init__(self, params, dist: Dist, device: torch.device, tokens_hint: int):
        self.dist, self.device, self.tokens_hint = dist, device, tokens_hint
        params = [p for p in params if p.requires_grad]
        by_dtype: dict[torch.dtype, list] = {torch.float32: []}  # (the sums ride in float32)
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self.flats: list[torch.Tensor] = []  # one buffer per dtype
        self.grads: list[torch.Tensor] = []  # the part of each that holds gradients
        for dtype, group in by_dtype.items():
            n = sum(p.numel() for p in group)
            flat = torch.zeros(n + 4 * (dtype == torch.float32), dtype=dtype, device=device)
            self.flats.append(flat)
            self.grads.append(flat[:n])
            if dtype == torch.float32:
                self.extras = flat[n:]
            offset = 0
            for p in group:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self.params = params
        self.views = [p.grad for p in params]

    def backward(self, loss: torch.Tensor) -> None:
        """The gradients of `loss` added into the buffers: one _foreach_add_ for all of them
        (a few kernels on a GPU), where autograd would add each parameter's on its own."""
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        given = [(v, g) for v, g in zip(self.views, grads, strict=True) if g is not None]
        if given:
            views, news = zip(*given, strict=True)
            torch._foreach_add_(list(views), list(news))

    def zero_grad(self) -> None:
        """One kernel per buffer (the gradients stay views into them: nothing sets one to
        None)."""
        for flat in self.flats:
            flat.zero_()

    def wrap(self, loss: Callable) -> Callable:
        """The step's loss(model, batch) (the objective's, or its compiled form)."""
        return loss

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward_scale(self, n_tokens: int) -> float:
        return 1.0 / (self.tokens_hint if self.dist.enabled else n_tokens)

    def reduce(self, out_of_memory: bool, losses: list, nlls: list, n_tokens: int) -> Sums:
        """The update's Sums over the ranks; the gradients averaged and normalised."""
        e = self.extras
        e[OUT_OF_MEMORY].fill_(float(out_of_memory))  # (fills: no copy from the host)
        e[TOKENS].fill_(float(n_tokens))
        if out_of_memory:  # (whatever the failed pass left is not applied by anyone)
            e[LOSS].zero_()
            e[NLL].zero_()
        else:
            e[LOSS].copy_(torch.stack(losses).sum())
            e[NLL].copy_(torch.stack(nlls).sum())
        if self.dist.enabled:
            with self.dist.together("the exchange of gradients"):
                for flat in self.flats:
                    torch.distributed.all_reduce(flat)
            factor = self.tokens_hint / e[TOKENS]  # (on the device)
            for grads in self.grads:
                grads.mul_(factor.to(grads.dtype))
        return Sums(*e.clone().unbind())  # (the next update writes over e)


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

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # (DDP's hooks run as autograd accumulates each gradient)

    def zero_grad(self) -> None:
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.zero_()

    def wrap(self, loss: Callable) -> Callable:
        """Through DDP's forward, which the exchange in the backward pass needs (the
        objective's own loss: train.compile is refused with ddp)."""
        return lambda model, batch: self.wrapped(batch)

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Accumulation: the ranks exchange in the last micro-batch's backward only."""
        return contextlib.nullcontext() if last else self.wrapped.no_sync()

    def backward_scale(self, n_tokens: int) -> torch.Tensor:
        """world / the global token count (DDP divides by world): summed on the device, before
        the backward passes that need it."""
        device = next(self.model.parameters()).device
        self.tokens = self.dist.sum(torch.full((), float(n_tokens), device=device))
        return self.dist.world / self.tokens

    def reduce(self, out_of_memory: bool, losses: list, nlls: list, n_tokens: int) -> Sums:
        assert not out_of_memory  # (ended the run: Trainer._backward)
        sums = self.dist.sum(torch.stack([torch.stack(losses).sum(), torch.stack(nlls).sum()]))
        return Sums(torch.zeros_like(self.tokens), sums[0], sums[1], self.tokens)


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


def build_exchange(cfg, model, optimizer, loss: Callable, dist: Dist, find_unused: bool):
    """The exchange train.data_parallel names (cfg: the train config); one process: Flat."""
    if dist.enabled and cfg.data_parallel == "ddp":
        return DDP(model, loss, dist, cfg.ddp_bucket_mb, find_unused)
    params = optimizer.param_groups[0]["params"]
    device = params[0].device
    return Flat(params, dist, device, dist.world * cfg.accum_steps * cfg.max_tokens)
