"""Packed batches (mt/data/packing.py, train.pack_width): each pair gets exactly the loss and
gradients it gets in an ordinary padded batch; every pair is trained once per epoch; the
blocks of a run have one shape; built by gathers, checked against a plain loop."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from mt.config import ModelConfig
from mt.data.batching import collate, collate_packed
from mt.data.corpus import ParallelData, Stats, TokenArray
from mt.data.packing import pack_blocks, rows_of
from mt.model import build_model
from mt.objectives.loss import reference_loss
from mt.tokens import BOS, EOS, PAD


def _corpus(n: int, seed: int = 0, longest: int = 12) -> ParallelData:
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 40, rng.integers(1, longest + 1))) for _ in range(n)]
    tgt = [list(rng.integers(4, 40, rng.integers(1, longest + 1))) for _ in range(n)]
    return ParallelData(TokenArray(src), TokenArray(tgt), Stats())


def test_a_block_holds_each_pair_as_a_loop_would_write_it():
    data = _corpus(9, seed=3)
    width, rows = 30, 4
    (block,) = pack_blocks(data.src.lengths, data.tgt.lengths, width, rows, seed=1)
    batch = collate_packed(data, block, width, rows)
    p = batch.packing
    expect = {k: np.zeros((rows, width), dtype=np.int64) for k in
              ("src", "in", "out", "sseg", "tseg", "spos", "tpos")}  # fmt: skip
    expect["src"][:] = expect["in"][:] = expect["out"][:] = PAD
    for r, row in enumerate(rows_of(block)):
        sc = tc = 0
        for seg, i in enumerate(row[:-1], start=1):
            s, t = list(data.src[i]), list(data.tgt[i])
            for j, tok in enumerate([*s, EOS]):
                expect["src"][r, sc + j], expect["sseg"][r, sc + j] = tok, seg
                expect["spos"][r, sc + j] = j
            for j, (a, b) in enumerate(zip([BOS, *t], [*t, EOS], strict=True)):
                expect["in"][r, tc + j], expect["out"][r, tc + j] = a, b
                expect["tseg"][r, tc + j], expect["tpos"][r, tc + j] = seg, j
            sc, tc = sc + len(s) + 1, tc + len(t) + 1
            assert sc <= width and tc <= width
    got = {"src": batch.src, "in": batch.tgt_in, "out": batch.tgt_out, "sseg": p.src_segments,
           "tseg": p.tgt_segments, "spos": p.src_positions, "tpos": p.tgt_positions}  # fmt: skip
    for k, v in expect.items():
        assert np.array_equal(got[k].numpy(), v), k
    assert batch.n_tokens == int((batch.tgt_out != PAD).sum())


def test_an_epoch_packs_every_pair_once_in_one_shape():
    data = _corpus(500, seed=4, longest=30)
    width, rows = 64, 16
    blocks = pack_blocks(data.src.lengths, data.tgt.lengths, width, rows, seed=7)
    seen = np.concatenate([b[b >= 0] for b in blocks])
    assert sorted(seen.tolist()) == list(range(500))
    shapes = {tuple(collate_packed(data, b, width, rows).src.shape) for b in blocks}
    assert shapes == {(rows, width)}
    again = pack_blocks(data.src.lengths, data.tgt.lengths, width, rows, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(blocks, again, strict=True))
    other = pack_blocks(data.src.lengths, data.tgt.lengths, width, rows, seed=8)
    assert not all(np.array_equal(a, b) for a, b in zip(blocks, other, strict=False))


@pytest.mark.parametrize(
    "norm, positional, tie",
    [
        ("post", "sinusoidal", "all"),
        ("pre", "learned", "none"),
        ("post", "learned", "decoder"),
        ("pre", "relative", "all"),
    ],
)
def test_a_packed_batch_gives_each_pair_its_own_loss_and_gradients(norm, positional, tie):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64, dropout=0.0,
                      norm=norm, positional=positional, tie_embeddings=tie)  # fmt: skip
    model = build_model(cfg, 40, 40)
    data = _corpus(23, seed=5)
    padded = collate(data, np.arange(23))
    loss_a, nll_a = reference_loss(model, padded, eps=0.1)
    (loss_a / padded.n_tokens).backward()
    grads_a = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    total_loss, total_nll, tokens = 0.0, 0.0, 0
    blocks = pack_blocks(data.src.lengths, data.tgt.lengths, 28, 6, seed=2)
    assert len(blocks) >= 2 and any(len(rows_of(b)) < 6 for b in blocks[-1:])
    for block in blocks:
        batch = collate_packed(data, block, 28, 6)
        loss, nll = reference_loss(model, batch, eps=0.1)
        (loss / padded.n_tokens).backward()
        total_loss, total_nll, tokens = total_loss + loss, total_nll + nll, tokens + batch.n_tokens
    assert tokens == padded.n_tokens
    torch.testing.assert_close(total_loss, loss_a, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(total_nll, nll_a, rtol=1e-5, atol=1e-4)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_a[k], rtol=1e-4, atol=1e-6, msg=k)
        assert torch.isfinite(p.grad).all()


def test_packed_training_runs_resumes_exactly_and_says_its_shape(tmp_path):
    """`mt train` with train.pack_width: one block shape said at start-up; stopped and resumed,
    the same losses as in one go."""
    from tests.conftest import EXACT_ADAM, train_tiny

    data = tmp_path / "data"
    sets = ("train.pack_width=64", "train.max_tokens=1024", "train.log_every=1",
            "train.valid_every=100", "train.save_every=4", "model.dropout=0.0",
            *EXACT_ADAM)  # fmt: skip
    log, whole = train_tiny(tmp_path / "whole", data, *sets, "train.max_steps=8")
    assert "packed blocks per epoch of 8 rows x 64 positions a side, in 1 shape" in log
    train_tiny(tmp_path / "split", data, *sets, "train.max_steps=4")
    _, split = train_tiny(tmp_path / "split", data, *sets, "train.max_steps=8")
    assert [s for s, _ in split] == list(range(1, 9))
    for (_, a), (_, b) in zip(split, whole, strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)


@pytest.mark.parametrize(
    "sets, says",
    [
        (["train.pack_width=64", "train.shape_buckets=8"], "two ways to few batch shapes"),
        (["train.pack_width=4096"], "must hold at least one row"),
        (["train.pack_width=8"], "at least data.max_len"),
        (["train.pack_width=64", "train.rdrop_alpha=1.0"], "R-Drop"),
        (["train.pack_width=64", "model.arch=rnn"], "model.arch transformer"),
        (["train.pack_width=64", "train.fast_paths=true"], "fast_paths"),
    ],
)
def test_packing_refuses_what_it_cannot_do_in_one_line(sets, says):
    from mt.config import load_config
    from mt.errors import MTError
    from tests.conftest import ROOT

    with pytest.raises(MTError, match=says):
        load_config(ROOT / "configs/tiny.yaml", sets)


@pytest.mark.parametrize("chunk", ["0", "100"])
def test_a_compiled_step_on_packed_blocks_is_one_graph_with_the_eager_losses(
    tmp_path, monkeypatch, chunk
):
    """train.compile with packing: one static graph for every block (aot_eager here), no graph
    break, the eager step's losses; also with the loss in chunks (train.compiled_loss_chunk)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from mt.config import load_config
    from mt.train.build import build_trainer
    from tests.conftest import ROOT, window_losses

    real_compile = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kw: real_compile(fn, backend="aot_eager", **kw)
    )

    def trainer(name, *more):
        cfg = load_config(ROOT / "configs/tiny.yaml", [
            f"data.dir={tmp_path / 'd'}", "train.device=cpu", "model.dropout=0.0",
            "train.pack_width=64", "train.max_tokens=1024", "train.update=device",
            *more])  # fmt: skip
        return build_trainer(cfg, tmp_path / name, log=lambda *_: None)

    torch._dynamo.reset()
    counters.clear()
    eager = trainer("e")
    comp = trainer("c", "train.compile=true", f"train.compiled_loss_chunk={chunk}")
    assert ("chunk=100" in repr(comp.objective.loss)) is (chunk == "100")
    comp.model.load_state_dict(eager.model.state_dict())
    data = eager.train_data
    blocks = pack_blocks(data.src.lengths, data.tgt.lengths, 64, 8, seed=3)[:3]
    for block in blocks:
        batch = [collate_packed(data, block, 64, 8)]
        assert eager.train_step(batch) and comp.train_step(batch)
    torch.testing.assert_close(window_losses(comp), window_losses(eager), rtol=1e-5, atol=0)
    # the step's one graph, and the bookkeeping after the backward (settle)
    assert counters["stats"]["unique_graphs"] == 1 + 1 and not counters["graph_break"]
    torch._dynamo.reset()


@pytest.mark.parametrize("block_size", [128, 8])
def test_flex_block_masks_are_the_dense_masks_and_give_the_same_logits(monkeypatch, block_size):
    """mt/fast/flex.py: the packed masks as FlexAttention mask functions, evaluated over every
    (query, key), are the dense masks of mt/data/packing.py, and the Transformer built from
    the Flex parts gives the reference's logits on a packed batch (FlexAttention's forward;
    it has no backward on a CPU: tests/test_cuda.py checks the gradients on a GPU), with the
    default blocks and with blocks small enough that some are skipped."""
    from torch.nn.attention.flex_attention import create_mask

    from mt.fast import flex
    from mt.model import Parts

    monkeypatch.setattr(flex, "BLOCK_SIZE", block_size)
    data = _corpus(40, seed=7)
    (block, *_) = pack_blocks(data.src.lengths, data.tgt.lengths, 30, 5, seed=4)
    batch = collate_packed(data, block, 30, 5)
    p = batch.packing
    s, t = p.src_segments, p.tgt_segments
    (r, w) = s.shape
    pairs = [
        (flex.encoder_mask_mod(s), p.encoder_mask()),
        (flex.decoder_mask_mod(t), p.decoder_mask()),
        (flex.cross_mask_mod(t, s), p.cross_mask()),
    ]
    for mod, dense in pairs:
        assert torch.equal(create_mask(mod, r, None, w, w, device="cpu"), dense)

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64, dropout=0.0,
                      attn_dropout=0.0)  # fmt: skip
    reference = build_model(cfg, 40, 40).eval()
    flexed = build_model(cfg, 40, 40, Parts(attention=flex.FlexMultiHeadAttention)).eval()
    flexed.load_state_dict(reference.state_dict())
    with torch.no_grad():
        want = reference.laid_out(batch.src, batch.tgt_in, p.layout())
        got = flexed.laid_out(batch.src, batch.tgt_in, flex.flex_layout(p))
        plain = flexed(batch.src, batch.tgt_in, batch.src_pad_mask)  # (no packing: reference)
    real = batch.tgt_out != PAD
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-5)
    assert torch.equal(plain, reference(batch.src, batch.tgt_in, batch.src_pad_mask))


@pytest.mark.parametrize(
    "device,sets,flex",
    [
        ("cuda", {}, True),
        ("cpu", {}, False),  # (no backward on a CPU)
        ("cuda", {"attn_dropout": 0.1}, False),  # (flex_attention has no dropout)
        ("cuda", {"positional": "relative"}, False),
        ("cuda", {"fast_paths": False}, False),
        ("cuda", {"compile": False}, False),
        ("cuda", {"pack_width": 0}, False),
    ],
)
def test_flex_attention_is_chosen_for_a_compiled_packed_step_on_a_gpu(device, sets, flex):
    from mt.config import TrainConfig
    from mt.train.parts import model_parts

    train = TrainConfig(pack_width=64, max_tokens=8192,
                        fast_paths=sets.get("fast_paths", "auto"))  # fmt: skip
    model = ModelConfig(attn_dropout=sets.get("attn_dropout", 0.0),
                        positional=sets.get("positional", "sinusoidal"))  # fmt: skip
    if sets.get("pack_width") == 0:
        train = TrainConfig(fast_paths="auto", pack_width=0)
    parts = model_parts(train, torch.device(device), compile=sets.get("compile", True),
                        model=model)  # fmt: skip
    assert (parts.attention.__name__ == "FlexMultiHeadAttention") is flex


@pytest.mark.parametrize("eps,chunk", [(0.1, 7), (0.0, 64), (0.1, 10_000)])
def test_the_compiled_chunked_loss_is_the_reference_in_value_and_gradient(eps, chunk):
    """train.compiled_loss_chunk's loss (mt.fast.loss.compiled_chunked_loss) on a packed
    batch: the reference's loss, NLL and gradients, eager and traced whole by torch.compile
    (aot_eager, fullgraph: no break); under bf16 autocast within bf16's rounding."""
    from mt.fast.loss import compiled_chunked_loss

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64, dropout=0.0)
    model = build_model(cfg, 40, 40)
    data = _corpus(23, seed=5)
    batch = collate_packed(
        data, pack_blocks(data.src.lengths, data.tgt.lengths, 28, 6, 2)[0], 28, 6
    )

    def run(loss_fn, autocast=False):
        model.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            loss, nll = loss_fn(model, batch)
        (loss / batch.n_tokens).backward()
        return loss.detach(), nll, {k: p.grad.clone() for k, p in model.named_parameters()}

    ref = run(functools.partial(reference_loss, eps=eps))
    chunked = functools.partial(compiled_chunked_loss, eps=eps, chunk=chunk)
    traced = torch.compile(chunked, backend="aot_eager", fullgraph=True, dynamic=False)
    for got in (run(chunked), run(traced)):
        torch.testing.assert_close(got[:2], ref[:2], rtol=1e-5, atol=1e-4)
        for k, g in got[2].items():
            torch.testing.assert_close(g, ref[2][k], rtol=1e-4, atol=1e-6, msg=k)
    half = run(chunked, autocast=True)
    torch.testing.assert_close(half[:2], ref[:2], rtol=2e-2, atol=0)
    torch._dynamo.reset()
