"""How the ranks' gradients become every rank's: train.data_parallel's two ways.

`Flat` (the default, and one process on a GPU), the device update's (mt/train/update/step.py):
every trained parameter's gradient is a view into a persistent flat buffer, one per dtype. An
update's first backward pass copies its gradients and its loss sums into the buffers, the next
ones add theirs, each with one foreach kernel for all of them. After the last, one in-place
all-reduce per buffer exchanges the gradients together with four numbers that ride at the end
of the float32 buffer: whether the rank ran out of memory, its loss and NLL sums, and its
target tokens. The gradients are then divided by the global token count on the device and
clipped (`settle`, one graph under train.compile), and a skipped update (out of memory on any
rank, a loss that is not finite) is skipped by Adam on the device: nothing is read by the
host, no copy is made, and an out-of-memory batch on one rank is skipped by all (they all
reach the all-reduce). Nothing overlaps the backward pass.

`ddp`: torch's DistributedDataParallel around one module whose forward is the whole objective
(model plus loss), its bucketed all-reduces overlapping the backward pass, in the plain update
as nanoGPT has it. A rank that runs out of memory cannot skip its batch alone (the others would
wait in DDP's all-reduces), so it ends the run, saying so.

Both normalise as one process would with the ranks' batches together: every gradient is the
sum of the token losses' gradients over all ranks and micro-batches, divided by the global
number of target tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from mt.data.batching import Batch
from mt.errors import MTError
from mt.runtime.distributed import Dist

# the numbers after the gradients in the float32 buffer
OUT_OF_MEMORY, LOSS, NLL, TOKENS = range(4)


def settle(
    flats: list[torch.Tensor], counts: torch.Tensor, hint: float, clip_norm: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What follows the exchange, on the device, as one graph where train.compile is on.
    flats: Flat's buffers, the float32 one first (the gradients, then its four numbers);
    counts: DeferredSkips' (skipped, out of memory) counts, added to; hint: the tokens the
    backward passes divided by; clip_norm: train.clip_norm (0: none).
    The gradients are to be multiplied by hint / the update's tokens, so that they are the
    gradient of the mean token loss, and clipped as torch.nn.utils.clip_grad_norm_ clips (the
    norm of all of them, taken once per buffer). That factor is left to fused Adam, which
    divides by its `grad_scale` as it reads each gradient (a pass over the buffers fewer).
    Returns Adam's found-inf flag (1.0: skip the update), 1 - it, the log window's row (loss
    sum, NLL sum, tokens; zeros when skipped) and the grad_scale."""
    extras = flats[0][-4:]
    out_of_memory = extras[OUT_OF_MEMORY] > 0
    skip = (out_of_memory | ~torch.isfinite(extras[LOSS])).float()
    counts.add_(torch.stack([skip, out_of_memory.float()]))
    row = torch.where(skip > 0, 0.0, extras[LOSS:])  # (a where: NaN times 0 is NaN)
    grads = [flats[0][:-4], *flats[1:]]
    factor = hint / extras[TOKENS]
    if clip_norm > 0:
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
        norm = factor * torch.linalg.vector_norm(torch.stack(norms))
        factor = factor * (clip_norm / (norm + 1e-6)).clamp(max=1.0)
    extras[OUT_OF_MEMORY : OUT_OF_MEMORY + 1].zero_()  # (a kernel: no number from the host)
    return skip, 1.0 - skip, row, 1.0 / factor


class Flat:
    """params: what the optimizer trains. tokens_hint: a number of target tokens the same on
    every rank, about an update's over all ranks; each backward pass takes its loss divided by
    it, which keeps fp16 activations' gradients at the scale of a per-token loss, and the
    exchanged gradients are multiplied by tokens_hint / (the global tokens) afterwards.
    compiled: settle as one compiled graph (train.compile)."""

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

    def reduce(self, out_of_memory: bool) -> None:
        """After the update's last backward pass: the buffers summed over the ranks."""
        if out_of_memory:  # (whatever the failed pass left is applied by no one)
            self.extras[OUT_OF_MEMORY].fill_(1.0)
        if self.dist.enabled:
            with self.dist.together("the exchange of gradients"):
                for flat in self.flats:
                    torch.distributed.all_reduce(flat)

    def finish(self, counts: torch.Tensor, clip_norm: float) -> tuple:
        """(found_inf, 1 - found_inf, log row, grad_scale): settle(), the gradients' factor
        folded into Adam's grad_scale."""
        return self.settle(self.flats, counts, float(self.tokens_hint), clip_norm)


def ddp_objective(model, loss: Callable, bucket_mb: float, find_unused: bool = False):
    """torch.nn.parallel.DistributedDataParallel around the objective (model plus loss: its
    forward(batch) gives the loss and NLL sums); bucket_mb: the size of its gradient buckets;
    find_unused: the objective leaves parameters without a gradient (the masked-LM
    pretraining of the encoder leaves the decoder)."""
    from torch.nn.parallel import DistributedDataParallel

    with warnings.catch_warnings():  # (its successor, forward_sync_buffers, still syncs)
        warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated")
        return DistributedDataParallel(
            _Objective(model, loss),
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=True,  # the buckets are the gradients: no copy
            find_unused_parameters=find_unused,
            broadcast_buffers=False,  # the model's buffers are constants: none each step
        )


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


def build_exchange(cfg, optimizer, dist: Dist, compiled: bool = False) -> Flat:
    """The device update's Flat exchange (cfg: the train config). compiled: its bookkeeping
    after the exchange as one compiled graph (train.compile)."""
    params = optimizer.param_groups[0]["params"]
    device = params[0].device
    hint = dist.world * cfg.accum_steps * cfg.max_tokens
    return Flat(params, dist, device, hint, compiled=compiled)
