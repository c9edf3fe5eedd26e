"""The output projection and the label-smoothed loss in one node, a chunk of rows at a time:
the (N, V) logits never exist whole. Equal to mt.objectives.loss.reference_loss in value and
gradient (tests/test_fast_paths.py); measurements in docs/performance.md."""

from __future__ import annotations

import torch

from mt.tokens import PAD

# Rows of logits computed at a time by linear_smoothed_cross_entropy (chosen by measurement,
# docs/performance.md). On a GPU every chunk also reads and writes the whole (V, D) gradient
# of the output matrix, so larger chunks may pay there: measure with
# `race.py --device cuda --patch mt.fast.loss:LOSS_CHUNK_ROWS=4096`.
LOSS_CHUNK_ROWS = 512


def _smoothed_nll(
    z: torch.Tensor, p: torch.Tensor, y: torch.Tensor, z_sum: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of the smoothed loss and of the NLL over one chunk, from its logits z (c, V), their
    softmax p and targets y (c,); z_sum: each row's sum of logits when known (else summed)."""
    v = z.shape[-1]
    zy = z.gather(-1, y[:, None]).squeeze(-1)
    py = p.gather(-1, y[:, None]).squeeze(-1)
    # logsumexp(z) = z_y - log p_y, exact unless p_y underflowed (log p_y < -69): those rows
    # take logsumexp itself (on GPU every chunk does, so as not to wait on the host)
    lse = zy - py.log()
    under = py < 1e-30
    if z.is_cuda or bool(under.any()):
        lse = torch.where(under, torch.logsumexp(z, -1), lse)
    nll = lse - zy  # -log p_y
    if eps == 0.0:
        return nll.sum(), nll.sum()
    others = v * lse - (z.sum(-1) if z_sum is None else z_sum) - nll  # sum_{j != y} -log p_j
    return ((1.0 - eps) * nll + eps / (v - 1) * others).sum(), nll.sum()


class _LinearSmoothedCrossEntropy(torch.autograd.Function):
    """label_smoothed_nll(log_softmax(h @ W^T), ...) fused with the output projection and
    computed in chunks of rows: the (N, V) logits never exist whole, only (chunk, V) at a time.
    The gradients for h and W are computed in the same pass (the same three matmuls as
    autograd would do) and scaled by the incoming gradient in backward; when no gradient is
    wanted (validation) they are skipped. The NLL output is for logging: not differentiable."""

    @staticmethod
    def forward(ctx, h, weight, target, eps, chunk, want_grad):
        n, v = h.shape[0], weight.shape[0]
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32  # softmax in fp32+
        # One dtype and no autocast (CPU fp32 training): the products go straight into their
        # destinations (out= and addmm_), with no temporaries per chunk. Under autocast the
        # products run as autocast casts them (bf16 on GPU), which out= would not do.
        same = h.dtype == weight.dtype == acc and not torch.is_autocast_enabled(h.device.type)
        loss_sum = h.new_zeros((), dtype=acc)
        nll_sum = h.new_zeros((), dtype=acc)
        grad_h = torch.empty_like(h) if want_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_grad else None
        off = eps / (v - 1) if eps > 0.0 else 0.0
        # sum_j z_j = h . sum_j W_j: the smoothing term's logit sums without a pass over (c, V)
        colsum = weight.sum(0, dtype=acc) if eps > 0.0 else None
        rows = min(chunk, n)
        # reused for every chunk: (chunk, V) logits, then probabilities
        logits = h.new_empty((rows, v), dtype=acc) if same else None
        p_buf = h.new_empty((rows, v), dtype=acc)
        for i in range(0, n, chunk):
            hc, y = h[i : i + chunk], target[i : i + chunk]
            c = hc.shape[0]
            z = torch.mm(hc, weight.t(), out=logits[:c]) if same else (hc @ weight.t()).to(acc)
            p = torch.softmax(z, dim=-1, out=p_buf[:c])  # (c, V)
            z_sum = torch.mv(hc, colsum) if same and eps > 0.0 else None  # (c,)
            loss, nll = _smoothed_nll(z, p, y, z_sum, eps)
            loss_sum += loss
            nll_sum += nll
            if want_grad:
                # d loss/d z = softmax - q, q = eps/(V-1) + (1 - eps - eps/(V-1)) * onehot(y);
                # the uniform eps/(V-1) is taken off after the loop, on (N, D) and (V, D)
                g = p.scatter_add_(-1, y[:, None], p.new_full((c, 1), -(1.0 - eps - off)))
                if same:
                    torch.mm(g, weight, out=grad_h[i : i + chunk])
                    grad_w.addmm_(g.t(), hc)
                else:
                    grad_h[i : i + chunk] = (g.to(weight.dtype) @ weight).to(h.dtype)
                    grad_w += (g.t().to(hc.dtype) @ hc).to(acc)
        if want_grad and off:
            grad_h.sub_((off * colsum).to(h.dtype))  # off * (1 ... 1) W
            grad_w.sub_(off * h.sum(0, dtype=acc))  # off * (1 ... 1)^T h
        ctx.mark_non_differentiable(nll_sum)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, _g_nll):
        grad_h, grad_w = ctx.saved_tensors
        return (
            grad_h * g_loss.to(grad_h.dtype),
            grad_w * g_loss.to(grad_w.dtype),
            None,
            None,
            None,
            None,
        )


def linear_smoothed_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    eps: float,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h: (N, D) decoder states of N target tokens that all count (padding removed);
    weight: (V, D) output projection. Returns (smoothed loss sum, NLL sum), the values of
    label_smoothed_nll(log_softmax(h @ weight.T)) with the gradient of the first, in memory
    for `chunk` rows of logits at a time (LOSS_CHUNK_ROWS when None). Only the smoothed loss
    is differentiable."""
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    return _LinearSmoothedCrossEntropy.apply(
        h, weight, target, eps, chunk or LOSS_CHUNK_ROWS, want_grad
    )


def chunked_loss(model, batch, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """mt.objectives.loss.reference_loss with the projection fused into the loss: the decoder
    states of the target tokens that count (padding removed) go straight into the chunked
    node."""
    keep = batch.tgt_out != PAD  # (B, T)
    h = model.decode(batch.tgt_in, model.encode(batch.src, batch.src_pad_mask), batch.src_pad_mask)[
        keep
    ]  # (N, D)
    return linear_smoothed_cross_entropy(h, model.output_weight, batch.tgt_out[keep], eps)


class _CompiledLinearCrossEntropy(torch.autograd.Function):
    """_LinearSmoothedCrossEntropy for a compiled step (train.compiled_loss_chunk): every row
    of h, those whose target is padding weighing nothing (a selection of the rows would give
    the graph a shape known only at run time), in chunks of a fixed size, of tensor operations
    alone, so that torch.compile traces it whole and fuses each chunk's softmax, loss and
    gradient into a few kernels. The products run in autocast's dtype (bf16 on a GPU), the
    softmax in fp32 a chunk at a time: the (N, V) fp32 log-probabilities and their gradient,
    which the reference keeps for its backward pass, never exist."""

    @staticmethod
    def forward(ctx, h, weight, target, eps, chunk):
        v = weight.shape[0]
        off = eps / (v - 1)  # the smoothed target's mass on each wrong class
        keep = (target != PAD).float()  # (N,)
        loss_sum = nll_sum = h.new_zeros((), dtype=torch.float32)
        grad_h, grad_w = [], torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
        for i in range(0, h.shape[0], chunk):
            hc, y, k = h[i : i + chunk], target[i : i + chunk, None], keep[i : i + chunk]
            z = (hc @ weight.t()).float()  # (c, V)
            lse = torch.logsumexp(z, -1, keepdim=True)  # (c, 1)
            nll = (lse - z.gather(-1, y)).squeeze(-1)  # -log p_y
            others = v * lse.squeeze(-1) - z.sum(-1) - nll  # sum_{j != y} -log p_j
            loss_sum = loss_sum + (((1.0 - eps) * nll + off * others) * k).sum()
            nll_sum = nll_sum + (nll * k).sum()
            # d loss / d z = softmax(z) - q, q = off + (1 - eps - off) * onehot(y)
            g = torch.exp(z - lse) - off
            g = g.scatter_add(-1, y, g.new_full(y.shape, -(1.0 - eps - off))) * k[:, None]
            grad_h.append((g @ weight).to(h.dtype))  # (c, D)
            grad_w = grad_w + (g.t() @ hc).float()  # (V, D)
        ctx.mark_non_differentiable(nll_sum)
        ctx.save_for_backward(torch.cat(grad_h), grad_w.to(weight.dtype))
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, _g_nll):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * g_loss.to(grad_h.dtype), grad_w * g_loss.to(grad_w.dtype), None, None, None


def compiled_chunked_loss(
    model, batch, eps: float, chunk: int, layout=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """mt.objectives.loss.reference_loss with the output projection fused into the loss, for a
    compiled step (a packed batch laid out by `layout`, else by its own dense masks): the
    decoder states of every target position go into the chunked node `chunk` rows at a time
    (train.compiled_loss_chunk)."""
    if batch.packing is None:
        memory = model.encode(batch.src, batch.src_pad_mask)
        h = model.decode(batch.tgt_in, memory, batch.src_pad_mask)  # (B, T, D)
    else:
        laid = batch.packing.layout() if layout is None else layout(batch.packing)
        h = model.laid_out(batch.src, batch.tgt_in, laid)
    return _CompiledLinearCrossEntropy.apply(
        h.reshape(-1, h.shape[-1]), model.output_weight, batch.tgt_out.reshape(-1), eps, chunk
    )


class _LinearRDropLoss(torch.autograd.Function):
    """mt.objectives.loss.rdrop_loss's value on two passes' decoder states, fused with the output
    projection and computed in chunks of rows like _LinearSmoothedCrossEntropy: the mean of the
    two passes' label-smoothed losses plus alpha times their symmetric KL (Liang et al. 2021).

    A row's symmetric KL needs no log-softmax: with z the logits and d = z_a - z_b,
    sum_j (p_a - p_b)_j (log p_a - log p_b)_j = sum_j (p_a - p_b)_j d_j = p_a.d - p_b.d, since
    the log-normalisers multiply sum_j (p_a - p_b)_j = 0. Its gradient for z_a is
    (p_a - p_b) + p_a * (d - p_a.d) (the softmax Jacobian is symmetric), for z_b the same with
    a and b swapped (d -> -d). The NLL output (the passes' mean) is for logging."""

    @staticmethod
    def forward(ctx, h_a, h_b, weight, target, eps, alpha, chunk):
        n, v = h_a.shape[0], weight.shape[0]
        acc = torch.float64 if h_a.dtype == torch.float64 else torch.float32
        loss_sum = h_a.new_zeros((), dtype=acc)
        nll_sum = h_a.new_zeros((), dtype=acc)
        grad_a, grad_b = torch.empty_like(h_a), torch.empty_like(h_b)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        off = eps / (v - 1) if eps > 0.0 else 0.0
        half = alpha / 2  # rdrop_loss weighs (KL(a||b) + KL(b||a)) / 2 by alpha
        w_t = weight.t()
        for i in range(0, n, chunk):
            ha, hb, y = h_a[i : i + chunk], h_b[i : i + chunk], target[i : i + chunk]
            z_a, z_b = (ha @ w_t).to(acc), (hb @ w_t).to(acc)
            p_a, p_b = torch.softmax(z_a, -1), torch.softmax(z_b, -1)
            loss_a, nll_a = _smoothed_nll(z_a, p_a, y, None, eps)
            loss_b, nll_b = _smoothed_nll(z_b, p_b, y, None, eps)
            d = z_a.sub_(z_b)  # z_a is not needed any more
            pd_a = (p_a * d).sum(-1, keepdim=True)  # (c, 1)
            pd_b = (p_b * d).sum(-1, keepdim=True)
            loss_sum += (loss_a + loss_b) / 2 + half * (pd_a - pd_b).sum()
            nll_sum += (nll_a + nll_b) / 2
            # d loss/d z_a = (p_a - q) / 2 + half * ((p_a - p_b) + p_a * (d - p_a.d)), with
            # q = off + (1 - eps - off) * onehot(y); the uniform off / 2 is taken off after the loop
            g_a = d.sub(pd_a).mul_(half).add_(0.5 + half).mul_(p_a).sub_(p_b, alpha=half)
            g_b = d.sub_(pd_b).mul_(-half).add_(0.5 + half).mul_(p_b).sub_(p_a, alpha=half)
            hit = p_a.new_full((y.shape[0], 1), -(1.0 - eps - off) / 2)
            g_a.scatter_add_(-1, y[:, None], hit)
            g_b.scatter_add_(-1, y[:, None], hit)
            grad_a[i : i + chunk] = (g_a.to(weight.dtype) @ weight).to(h_a.dtype)
            grad_b[i : i + chunk] = (g_b.to(weight.dtype) @ weight).to(h_b.dtype)
            grad_w += (g_a.t().to(ha.dtype) @ ha).to(acc)
            grad_w += (g_b.t().to(hb.dtype) @ hb).to(acc)
        if off:
            colsum = weight.sum(0, dtype=acc)  # (1 ... 1) W
            grad_a.sub_((off / 2 * colsum).to(h_a.dtype))
            grad_b.sub_((off / 2 * colsum).to(h_b.dtype))
            grad_w.sub_(off / 2 * (h_a.sum(0, dtype=acc) + h_b.sum(0, dtype=acc)))
        ctx.mark_non_differentiable(nll_sum)
        ctx.save_for_backward(grad_a, grad_b, grad_w.to(weight.dtype))
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, _g_nll):
        grad_a, grad_b, grad_w = ctx.saved_tensors
        return (
            grad_a * g_loss.to(grad_a.dtype),
            grad_b * g_loss.to(grad_b.dtype),
            grad_w * g_loss.to(grad_w.dtype),
            None,
            None,
            None,
            None,
        )


def linear_rdrop_loss(
    h_a: torch.Tensor,
    h_b: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    eps: float,
    alpha: float,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h_a, h_b: (N, D) two dropout passes' decoder states of the same N target tokens;
    weight: (V, D). Returns (R-Drop loss sum, mean NLL sum of the two passes), the values of
    mt.objectives.loss.rdrop_loss on those logits with the gradient of the first, `chunk` rows
    of logits at a time (LOSS_CHUNK_ROWS when None)."""
    return _LinearRDropLoss.apply(h_a, h_b, weight, target, eps, alpha, chunk or LOSS_CHUNK_ROWS)


def chunked_rdrop_loss(model, batch, eps: float, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """mt.objectives.loss.rdrop_loss with both passes in one: the batch goes through the model
    stacked on itself (each copy draws its own dropout masks, as in Liang et al.'s code), and
    the two halves' decoder states go into the fused R-Drop loss. Twice the plain step's work in
    two batches' worth of rows, instead of two passes that each also build (N, V) logits and
    their KL's (N, V) temporaries. In evaluation the passes are equal: the plain loss."""
    if not model.training:
        return chunked_loss(model, batch, eps)
    src, tgt_in = torch.cat([batch.src, batch.src]), torch.cat([batch.tgt_in, batch.tgt_in])
    src_pad_mask = src == PAD
    h = model.decode(tgt_in, model.encode(src, src_pad_mask), src_pad_mask)  # (2B, T, D)
    keep = batch.tgt_out != PAD
    b = keep.shape[0]
    return linear_rdrop_loss(
        h[:b][keep], h[b:][keep], model.output_weight, batch.tgt_out[keep], eps, alpha
    )
