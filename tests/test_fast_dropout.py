"""mt's CPU dropout (mt/fast/dropout.py): the counter-hash mask bits are a keyed hash drawn
from torch's generator, masks keep the expected fraction with independent lanes, and attention
dropout on CPU is unbiased and leaves padded keys unattended."""

import pytest
import torch


@pytest.mark.parametrize("p, bits", [(0.1, 8), (0.3, 8), (0.01, 16), (0.03, 16)])
def test_fast_dropout_keeps_expected_fraction_and_scales(p, bits):
    """Elements are kept with probability 1 - p, p resolved to 1/256 only where that is within
    2% of p (else 1/65536), and scaled by exactly 1 / P(kept): the expectation is kept.
    Backward passes gradient through the kept elements only, with the same scale."""
    from mt.fast.dropout import dropout, keep_mask, lane_bits

    assert lane_bits(p) == bits
    levels = 2**bits
    resolved = round(p * levels) / levels
    assert abs(resolved - p) <= 0.02 * p
    assert keep_mask((3,), p, torch.device("cpu")).scale * (1 - resolved) == pytest.approx(1.0)
    torch.manual_seed(0)
    x = torch.ones(400_000, requires_grad=True)
    y = dropout(x, p, training=True)
    kept = (y != 0).float().mean().item()
    assert abs(kept - (1 - resolved)) < 0.004
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - resolved)))
    y.sum().backward()
    assert torch.equal(x.grad != 0, y != 0)
    assert torch.equal(x.grad, y.detach())
    assert dropout(x, p, training=False) is x


@pytest.mark.parametrize("p, lanes", [(0.3, 8), (0.01, 4)])
def test_dropout_mask_lanes_are_independent_and_any_shape_works(p, lanes):
    """Four (two) mask elements come from each 32-bit hash: each lane keeps 1 - p, neighbours
    are independent (both kept: (1 - p)^2), the mask comes out in the dtype asked for, and sizes
    that are not a multiple of the lanes per word work."""
    from mt.fast.dropout import keep_mask

    torch.manual_seed(0)
    keep = keep_mask((100_003, lanes), p, torch.device("cpu"))
    mask = keep.of(torch.float32)
    assert mask.shape == (100_003, lanes) and mask.dtype == torch.float32
    assert keep.lanes.element_size() == 8 // lanes  # what backward keeps: 1 or 2 bytes
    assert set(mask.unique().tolist()) == {0.0, 1.0}
    for lane in range(lanes):
        assert abs(mask[:, lane].mean().item() - (1 - p)) < 0.01
    both = (mask[:, 0] * mask[:, 1]).mean().item()
    assert abs(both - (1 - p) ** 2) < 0.01
    last = (mask[:, 0] * mask[:, -1]).mean().item()
    assert abs(last - (1 - p) ** 2) < 0.01
    odd = keep_mask((7, 3), 0.5, torch.device("cpu"))
    assert odd.of(torch.float64).shape == (7, 3)


def _lowbias32_bytes(n: int, k1: int, k2: int) -> bytes:
    """The reference: lowbias32 of counter + k1, k2 mixed in, in Python's exact integers."""
    m = 2**32
    out = bytearray()
    for i in range((n + 3) // 4):
        x = (i + k1) % m
        x ^= x >> 16
        x = x * 0x7FEB352D % m
        x ^= x >> 15
        x ^= k2 % m
        x = x * 0x846CA68B % m
        x ^= x >> 16
        out += x.to_bytes(4, "little")
    return bytes(out[:n])


def test_random_bytes_are_a_keyed_hash_drawn_from_torchs_generator():
    """The dropout lanes are lowbias32(counter + k1) with k2 between its rounds, computed with
    torch's int32 ops exactly as with exact integers mod 2^32 (where they wrap around); the
    keys come from torch's generator, so the same seed gives the same bytes and the next call
    other bytes; the byte values are uniform (chi-square over 256 bins) and neighbours are
    uncorrelated, also for a mask too large for the counters cached by a smaller one."""
    from mt.fast.dropout import random_bytes

    cpu = torch.device("cpu")
    torch.manual_seed(3)
    k1, k2 = torch.randint(-(2**31), 2**31, (2,), dtype=torch.int64).tolist()
    torch.manual_seed(3)
    small = random_bytes(1_001, cpu)
    assert small.dtype == torch.int8 and small.shape == (1_001,)
    assert small.numpy().tobytes() == _lowbias32_bytes(1_001, k1, k2)
    big = random_bytes(1_000_000, cpu)
    assert not torch.equal(big[:1_001], small)
    torch.manual_seed(3)
    random_bytes(1_001, cpu)
    assert torch.equal(random_bytes(1_000_000, cpu), big)
    counts = torch.bincount(big.long() + 128, minlength=256).double()
    expected = big.numel() / 256
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 255 + 5 * (2 * 255) ** 0.5  # mean 255, sd 22.6
    f = big.double()
    for lag in (1, 4):
        assert abs(torch.corrcoef(torch.stack([f[:-lag], f[lag:]]))[0, 1].item()) < 0.005


def test_attention_dropout_on_cpu_is_unbiased_and_respects_padding():
    """On CPU, training-time attention dropout goes through the explicit path with mt's
    dropout mask: independent per row, unbiased (the mean over many draws is the output
    without dropout), and padded keys still get no attention."""
    from mt.fast.modules import FastMultiHeadAttention

    torch.manual_seed(0)
    attn = FastMultiHeadAttention(16, 2, 0.25, self_attention=True)
    x = torch.randn(1, 5, 16)
    may_attend = torch.tensor([True, True, True, False, False]).view(1, 1, 1, 5)
    expected = attn.eval()(x, mask=may_attend)
    draws = 4000
    xs = x.expand(draws, 5, 16).clone().requires_grad_()
    out = attn.train()(xs, mask=may_attend)
    assert not torch.allclose(out[0], out[1])  # masks differ per row
    draws_out = out.detach()
    spread = draws_out.std(0) / draws**0.5  # standard error of the mean
    assert float(((draws_out.mean(0) - expected[0].detach()).abs() / spread).max()) < 5
    out.sum().backward()
    assert bool(torch.isfinite(xs.grad).all())
    # what stands at padded key positions cannot change the output at all
    torch.manual_seed(1)
    a = attn(x, mask=may_attend)
    y = x.clone()
    y[:, 3:] = 100.0
    torch.manual_seed(1)
    b = attn(y, mask=may_attend)
    torch.testing.assert_close(a[:, :3], b[:, :3])
