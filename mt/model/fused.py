"""Fused CPU training paths: one autograd node for a chain of ops, keeping fewer tensors for
backward and making fewer passes over memory than the op-by-op chain. They are used when
training in fp32 on CPU (`cpu_fused`); on GPU, autocast and PyTorch's kernels do the job.
Each equals its op-by-op chain with the same dropout mask (tests/test_loss_schedule.py)."""
from __future__ import annotations

import torch

from mt.model.dropout import keep_mask


def cpu_fused(x: torch.Tensor, weight: torch.Tensor, training: bool) -> bool:
    """Whether a fused path applies: CPU training with gradients, fp32 as the weights."""
    return (training and not x.is_cuda and torch.is_grad_enabled() and x.dtype == weight.dtype
            and not torch.is_autocast_enabled("cpu"))


class _FeedForward(torch.autograd.Function):
    """y = dropout(relu(x W1^T + b1)) W2^T + b2 keeping one (N, d_ff) tensor for backward.

    The hidden activation a = relu(h) * mask is needed anyway for W2's gradient, and it also
    tells relu's and dropout's backward everything: an element passes gradient exactly where
    a > 0. So neither relu's output nor the dropout mask is kept, and relu and dropout run in
    place: about a third less activation memory in an FFN. The dropout scale s is applied to
    the small matrices instead of the (N, d_ff) ones: y = s * (a W2^T) + b2 (addmm's alpha),
    dL/dW2 = s * g^T a, dL/da = g (s * W2).
    """

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, p):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        a = torch.addmm(b1, x2, w1.t()).relu_()
        scale = 1.0
        if p > 0.0:
            keep, scale = keep_mask(a.shape, p, a.device)
            a.mul_(keep)
        ctx.save_for_backward(x2, w1, w2, a)
        ctx.scale = scale
        return torch.addmm(b2, a, w2.t(), alpha=scale).view(*shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, w1, w2, a = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        scale = ctx.scale
        grad_w2, grad_b2 = (g.t() @ a).mul_(scale), g.sum(0)
        # relu's and dropout's backward (gradient where a > 0): one pass in place
        gh = g @ (w2 * scale if scale != 1.0 else w2)
        torch.ops.aten.threshold_backward.grad_input(gh, a, 0.0, grad_input=gh)
        grad_w1, grad_b1 = gh.t() @ x2, gh.sum(0)
        grad_x = (gh @ w1).view(*grad.shape[:-1], w1.shape[1])
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None


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
        keep = None
        if p > 0.0:
            keep, scale = keep_mask(f.shape, p, f.device)
            s = torch.addcmul(x, f, keep, value=scale)          # x + dropout(f), one pass
        else:
            s, scale = x + f, 1.0
        y, mean, rstd = torch.native_layer_norm(s, [d], weight, bias, eps)
        from_output = bool((weight.abs() >= 1e-3).all())      # CPU: no device sync to wait on
        if from_output:
            ctx.save_for_backward(y, rstd, weight, bias, keep)
        else:
            ctx.save_for_backward(s, mean, rstd, weight, bias, keep)
        ctx.from_output, ctx.scale, ctx.d = from_output, scale, d
        return y

    @staticmethod
    def backward(ctx, gy):
        if ctx.from_output:
            y, rstd, weight, bias, keep = ctx.saved_tensors
            inv = weight.reciprocal()
            x_hat = torch.addcmul(-bias * inv, y, inv)        # (N, D): LayerNorm's x_hat
            # LayerNorm's backward fed x_hat with mean 0 and rstd 1 gives the weight and bias
            # gradients as they are and the input gradient divided by rstd
            unit = torch.ones_like(rstd)
            gs, gw, gb = torch.ops.aten.native_layer_norm_backward(
                gy, x_hat, [ctx.d], torch.zeros_like(rstd), unit, weight, bias,
                [True, True, True])
            gs.mul_(rstd)
        else:
            s, mean, rstd, weight, bias, keep = ctx.saved_tensors
            gs, gw, gb = torch.ops.aten.native_layer_norm_backward(
                gy, s, [ctx.d], mean, rstd, weight, bias, [True, True, True])
        gf = gs if keep is None else gs.mul(keep).mul_(ctx.scale)
        return gs, gf, gw, gb, None, None


def add_norm(x, f, weight, bias, p: float, eps: float) -> torch.Tensor:
    """The fused CPU training path of LayerNorm(x + dropout(f)) (see _AddNorm)."""
    return _AddNorm.apply(x, f, weight, bias, p, eps)
