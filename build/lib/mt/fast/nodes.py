"""Fused CPU training paths: one autograd node for a chain of ops, keeping fewer tensors for
backward and making fewer passes over memory than the op-by-op chain. They are used when
training in fp32 on CPU (`cpu_fused`); on GPU, autocast and PyTorch's kernels do the job.
Each equals its op-by-op chain with the same dropout mask (tests/test_fast_paths.py)."""

from __future__ import annotations

import torch

from mt.fast.dropout import KeepMask, keep_mask


def cpu_fused(x: torch.Tensor, weight: torch.Tensor, training: bool) -> bool:
    """Whether a fused path applies: CPU training with gradients, fp32 as the weights."""
    return (
        training
        and not x.is_cuda
        and torch.is_grad_enabled()
        and x.dtype == weight.dtype
        and not torch.is_autocast_enabled("cpu")
    )


# Rows of the FFN taken at a time: the (rows, d_ff) slice of the hidden activation stays in
# cache from the first matmul through relu, dropout and the second matmul (see _FeedForward).
FFN_CHUNK_ROWS = 1024


class _FeedForward(torch.autograd.Function):
    """y = dropout(relu(x W1^T + b1)) W2^T + b2 keeping one (N, d_ff) tensor for backward.

    The hidden activation a = relu(h) * mask is needed anyway for W2's gradient, and it also
    tells relu's and dropout's backward everything: an element passes gradient exactly where
    a > 0. So neither relu's output nor the dropout mask is kept, and relu and dropout run in
    place: about a third less activation memory in an FFN. The dropout scale s is applied to
    the small matrices instead of the (N, d_ff) ones: y = s * (a W2^T) + b2 (addmm's alpha),
    dL/dW2 = s * g^T a, dL/da = g (s * W2).

    The rows go FFN_CHUNK_ROWS at a time through the chain that produces or consumes the
    hidden activation (forward: matmul, relu, mask, matmul; backward: matmul, relu's and
    dropout's gradient, matmul), each step reading the slice the last one wrote while it is
    still in cache, and the 0/1 mask lives in one reused chunk-sized buffer (the chunk size
    was chosen by measurement: docs/performance.md).
    """

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, p):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        n = x2.shape[0]
        a = x2.new_empty(n, w1.shape[0])
        y = x2.new_empty(n, w2.shape[0])
        keep = keep_mask(a.shape, p, a.device) if p > 0.0 else None
        scale = keep.scale if keep is not None else 1.0
        mask = a.new_empty(min(n, FFN_CHUNK_ROWS), w1.shape[0]) if keep is not None else None
        for rows in _chunks(n):
            h = torch.addmm(b1, x2[rows], w1.t(), out=a[rows]).relu_()
            if keep is not None:
                h.mul_(keep.of(h.dtype, rows, out=mask[: len(h)]))
            torch.addmm(b2, h, w2.t(), alpha=scale, out=y[rows])
        ctx.save_for_backward(x2, w1, w2, a)
        ctx.scale = scale
        return y.view(*shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, w1, w2, a = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        scale = ctx.scale
        grad_w2, grad_b2 = (g.t() @ a).mul_(scale), g.sum(0)
        w2 = w2 * scale if scale != 1.0 else w2
        gh, grad_x = torch.empty_like(a), x2.new_empty(x2.shape)
        for rows in _chunks(len(g)):
            gh_rows = torch.mm(g[rows], w2, out=gh[rows])
            # relu's and dropout's backward (gradient where a > 0): in place
            torch.ops.aten.threshold_backward.grad_input(gh_rows, a[rows], 0.0, grad_input=gh_rows)
            torch.mm(gh_rows, w1, out=grad_x[rows])
        grad_w1, grad_b1 = gh.t() @ x2, gh.sum(0)
        return grad_x.view(*grad.shape[:-1], w1.shape[1]), grad_w1, grad_b1, grad_w2, grad_b2, None


def _chunks(n: int):
    """Slices of FFN_CHUNK_ROWS rows covering range(n)."""
    return (slice(s, min(s + FFN_CHUNK_ROWS, n)) for s in range(0, n, FFN_CHUNK_ROWS))


def feed_forward(x, w1, b1, w2, b2, p: float) -> torch.Tensor:
    """The fused CPU training path of the position-wise FFN (see _FeedForward)."""
    return _FeedForward.apply(x, w1, b1, w2, b2, p)


class _AddNorm(torch.autograd.Function):
    """y = LayerNorm(x + dropout(f)), the post-LN residual (Vaswani et al. 2017, sec. 5.4),
    keeping LayerNorm's output instead of its input for backward.

    The output y is kept anyway by whatever reads it next (the next layer's projections), and
    it gives back LayerNorm's normalised input: x_hat = (y - bias) / weight. So the sum
    x + dropout(f) is not kept: one (N, D) tensor less per residual. This needs no weight
    element near zero; when one is, the sum is kept as usual.
    """

    @staticmethod
    def forward(ctx, x, f, weight, bias, p, eps):
        d = x.shape[-1]
        lanes, threshold = None, 0
        if p > 0.0:
            keep = keep_mask(f.shape, p, f.device)
            lanes, threshold, scale = keep
            s = torch.addcmul(x, f, keep.of(f.dtype), value=scale)  # x + dropout(f), one pass
        else:
            s, scale = x + f, 1.0
        y, mean, rstd = torch.native_layer_norm(s, [d], weight, bias, eps)
        from_output = bool((weight.abs() >= 1e-3).all())  # CPU: no device sync to wait on
        if from_output:
            ctx.save_for_backward(y, rstd, weight, bias, lanes)
        else:
            ctx.save_for_backward(s, mean, rstd, weight, bias, lanes)
        ctx.from_output, ctx.scale, ctx.threshold, ctx.d = from_output, scale, threshold, d
        return y

    @staticmethod
    def backward(ctx, gy):
        if ctx.from_output:
            y, rstd, weight, bias, lanes = ctx.saved_tensors
            inv = weight.reciprocal()
            x_hat = torch.addcmul(-bias * inv, y, inv)  # (N, D): LayerNorm's x_hat
            # LayerNorm's backward fed x_hat with mean 0 and rstd 1 gives the weight and bias
            # gradients as they are and the input gradient divided by rstd
            unit = torch.ones_like(rstd)
            gs, gw, gb = torch.ops.aten.native_layer_norm_backward(
                gy, x_hat, [ctx.d], torch.zeros_like(rstd), unit, weight, bias, [True, True, True]
            )
            gs.mul_(rstd)
        else:
            s, mean, rstd, weight, bias, lanes = ctx.saved_tensors
            gs, gw, gb = torch.ops.aten.native_layer_norm_backward(
                gy, s, [ctx.d], mean, rstd, weight, bias, [True, True, True]
            )
        if lanes is None:
            return gs, gs, gw, gb, None, None
        gf = gs.mul(KeepMask(lanes, ctx.threshold, ctx.scale).of(gs.dtype)).mul_(ctx.scale)
        return gs, gf, gw, gb, None, None


def add_norm(x, f, weight, bias, p: float, eps: float) -> torch.Tensor:
    """The fused CPU training path of LayerNorm(x + dropout(f)) (see _AddNorm)."""
    return _AddNorm.apply(x, f, weight, bias, p, eps)


class _AttentionOut(torch.autograd.Function):
    """out = (dropout(softmax(q k^T / sqrt(d_head) masked)) v) W^T + b: attention, its dropout
    (p may be 0) and the output projection in one node, for CPU training, taking the input
    projections as they come out of their matmuls ((B, T, 3D) for self-attention, or
    (B, T, D) and (B, S, 2D) for cross-attention) and giving their gradients back the same way.

    The op-by-op chain (split the heads, SDPA or softmax, merge them, project) copies every
    head-split tensor twice more in backward (unbind's stack, then the permute's copy into the
    projection's layout), keeps the
    context (dropout(weights) v, the projection's input: one (N, D) tensor per attention) and
    allocates a new tensor at every step (scale, mask, softmax, dropout, scale). Here each
    gradient is written once into its projection's layout, the context is recomputed in
    backward from the kept weights, mask and v (one small batched matmul: S / D of the
    projection's work), and the scaling, masking and dropout scale run in place or fold into
    the matmuls: one (N, D) tensor less per attention and far fewer allocations of changing
    sizes, which is what keeps a CPU process's heap from growing (see mt/runtime/memory.py).
    Measurements: docs/performance.md."""

    @staticmethod
    def forward(ctx, proj, kv_proj, n_heads, attn_mask, weight, bias, p):
        if kv_proj is None:
            qh, kh, vh = _split_heads(proj, 3, n_heads)
        else:
            (qh,) = _split_heads(proj, 1, n_heads)
            kh, vh = _split_heads(kv_proj, 2, n_heads)
        bsz, t = proj.shape[:2]
        h, s, dh = n_heads, kh.shape[1], qh.shape[2]
        scale = dh**-0.5
        scores = torch.bmm(qh, kh.transpose(1, 2)).mul_(scale)  # (B*H, T, S)
        view = scores.view(bsz, h, t, s)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            view.masked_fill_(attn_mask.logical_not(), float("-inf"))
        elif attn_mask is not None:
            view.add_(attn_mask)
        weights = torch.softmax(scores, -1)
        del scores, view
        lanes, threshold, dscale = None, 0, 1.0
        dropped = weights
        if p > 0.0:
            keep = keep_mask(weights.shape, p, weights.device)
            lanes, threshold, dscale = keep
            dropped = weights * keep.of(weights.dtype)
        context = _head_rows(torch.bmm(dropped, vh), bsz)  # the scale: alpha
        del dropped
        out = torch.addmm(bias, context, weight.t(), alpha=dscale)
        ctx.save_for_backward(qh, kh, vh, weights, lanes, weight)
        ctx.dims = bsz, h, t, s, dh, scale, dscale, threshold
        ctx.cross = kv_proj is not None
        ctx.bias_shape = (
            None if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask.shape
        )
        return out.view(bsz, t, weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        qh, kh, vh, weights, lanes, weight = ctx.saved_tensors
        bsz, h, t, s, dh, scale, dscale, threshold = ctx.dims
        keep = None if lanes is None else KeepMask(lanes, threshold, dscale).of(weights.dtype)
        g = grad.reshape(bsz * t, -1)
        dropped = weights if keep is None else weights * keep
        context = _head_rows(torch.bmm(dropped, vh), bsz)  # recomputed
        grad_w = torch.mm(g.t(), context)
        if dscale != 1.0:
            grad_w.mul_(dscale)
        grad_b = g.sum(0)
        del context
        # the context's gradient, per head: (B*H, T, Dh)
        g_ctx = g @ (weight * dscale if dscale != 1.0 else weight)
        g_ctx = g_ctx.view(bsz, t, h, dh).transpose(1, 2).reshape(-1, t, dh)
        grad_v = torch.bmm(dropped.transpose(1, 2), g_ctx)
        del dropped
        g_w = torch.bmm(g_ctx, vh.transpose(1, 2))  # (B*H, T, S)
        if keep is not None:
            g_w.mul_(keep)
        g_scores = torch._softmax_backward_data(g_w, weights, -1, weights.dtype)
        grad_mask = None
        if ctx.bias_shape is not None and ctx.needs_input_grad[3]:  # a bias made from q
            grad_mask = g_scores.view(bsz, h, t, s).sum_to_size(ctx.bias_shape)
            g_scores = g_scores * scale  # grad_mask may be g_scores itself
        else:
            g_scores.mul_(scale)
        grad_q = torch.bmm(g_scores, kh)
        grad_k = torch.bmm(g_scores.transpose(1, 2), qh)
        if ctx.cross:
            grad_proj, grad_kv = _merge_heads([grad_q], bsz), _merge_heads([grad_k, grad_v], bsz)
        else:
            grad_proj, grad_kv = _merge_heads([grad_q, grad_k, grad_v], bsz), None
        return grad_proj, grad_kv, None, grad_mask, grad_w, grad_b, None


def _split_heads(x: torch.Tensor, n: int, h: int) -> list[torch.Tensor]:
    """(B, T, n*H*Dh), n projections side by side -> n (B*H, T, Dh) tensors, one per head."""
    b, t, _ = x.shape
    parts = x.reshape(b, t, n, h, -1)
    return [parts[:, :, i].transpose(1, 2).reshape(b * h, t, -1) for i in range(n)]


def _merge_heads(parts: list[torch.Tensor], bsz: int) -> torch.Tensor:
    """The inverse of _split_heads: n (B*H, T, Dh) -> (B, T, n*H*Dh), each copied once."""
    bh, t, dh = parts[0].shape
    h = bh // bsz
    out = parts[0].new_empty(bsz, t, len(parts), h, dh)
    for i, part in enumerate(parts):
        out[:, :, i].copy_(part.view(bsz, h, t, dh).transpose(1, 2))
    return out.view(bsz, t, -1)


def _head_rows(x: torch.Tensor, bsz: int) -> torch.Tensor:
    """(B*H, T, Dh) per head -> (B*T, H*Dh): one row per position, heads side by side."""
    bh, t, dh = x.shape
    h = bh // bsz
    return x.view(bsz, h, t, dh).transpose(1, 2).reshape(bsz * t, h * dh)


def attention_out(proj, kv_proj, n_heads: int, attn_mask, weight, bias, p: float) -> torch.Tensor:
    """The fused CPU training path of attention with dropout p (0 allowed) and the output
    projection (see _AttentionOut). proj: (B, T, 3D), the self-attention's q, k and v
    projections side by side, or (B, T, D), the queries of a cross-attention whose keys and
    values are kv_proj: (B, S, 2D). attn_mask: bool (True = may attend; any causal mask
    included) or an additive float bias, broadcastable to (B, H, T, S). Returns (B, T, D)."""
    return _AttentionOut.apply(proj, kv_proj, n_heads, attn_mask, weight, bias, p)
