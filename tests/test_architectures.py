"""Every model.arch / attention / norm / positional variant honours the same contracts:
cached decoding equals uncached, beam 1 equals greedy, padding changes nothing, and it
trains, saves, loads and translates through the CLI."""

import pytest
import torch

from mt.config import ModelConfig
from mt.decode.cache import DecodeCache
from mt.model import build_model
from mt.model.attention import CAUSAL, MultiHeadAttention
from mt.tokens import PAD
from tests.conftest import (
    ROOT,
    V,
    assert_user_error,
    beam_search,
    greedy,
    make_src,
    run_mt,
    run_tiny,
)

VARIANTS = {
    "transformer-post-sinusoidal": {"arch": "transformer"},
    "transformer-pre-learned": {"arch": "transformer", "norm": "pre", "positional": "learned"},
    "transformer-relative": {"arch": "transformer", "positional": "relative", "max_relative": 3},
    "rnn-bahdanau": {"arch": "rnn", "attention": "bahdanau", "enc_layers": 2, "dec_layers": 2},
    "rnn-luong": {"arch": "rnn", "attention": "luong"},
    "rnn-none": {"arch": "rnn", "attention": "none", "tie_embeddings": "none"},
    "decoder_only-sinusoidal": {"arch": "decoder_only", "norm": "pre"},
    "decoder_only-relative": {"arch": "decoder_only", "positional": "relative", "max_relative": 4},
}


def make(variant, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        **{
            "d_model": 32,
            "n_heads": 4,
            "enc_layers": 2,
            "dec_layers": 2,
            "d_ff": 64,
            "dropout": 0.1,
            "attn_dropout": 0.1,
            "max_positions": 64,
            **VARIANTS[variant],
        }
    )
    return build_model(cfg, V, V).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_uncached(variant):
    model = make(variant)
    src = make_src([6, 4, 8])
    mask = src == PAD
    memory = model.encode(src, mask)
    tgt = torch.randint(4, V, (3, 7))
    full = model.project(model.decode(tgt, memory, mask))
    cache = DecodeCache(model.cache_layers)
    steps = [
        model.project(model.decode(tgt[:, t : t + 1], memory, mask, cache=cache, start=t))
        for t in range(tgt.shape[1])
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    for b in (1, 3):
        assert beam_search(model, src, mask, b) == beam_search(model, src, mask, b, use_cache=False)
    assert greedy(model, src, mask) == greedy(model, src, mask, use_cache=False)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(2))
def test_beam_one_equals_greedy(variant, seed, beam_of_one):
    model = make(variant, seed)
    src = make_src([9, 3, 6, 2], seed=seed)
    mask = src == PAD
    assert beam_search(model, src, mask, beam=1) == greedy(model, src, mask)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_does_not_change_outputs(variant):
    model = make(variant)
    lengths = [7, 3, 5]
    src = make_src(lengths)
    tgt = torch.randint(4, V, (3, 6))
    batched = model(src, tgt, src == PAD)
    for i, n in enumerate(lengths):
        alone = model(src[i : i + 1, :n], tgt[i : i + 1], src[i : i + 1, :n] == PAD)
        torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_target_future_is_hidden_and_the_source_is_read(variant):
    """The model cannot see target tokens ahead of the current one (for decoder_only: the
    one causal stack over source and target), and it does read the source."""
    model = make(variant)
    src = make_src([6, 6])
    tgt = torch.randint(4, V, (2, 8))
    out = model(src, tgt, src == PAD)
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, V, (2, 3))
    out2 = model(src, changed, src == PAD)
    torch.testing.assert_close(out[:, :5], out2[:, :5])
    assert not torch.allclose(out[:, 5:], out2[:, 5:])
    other_src = src.clone()
    other_src[:, 0] = (src[:, 0] - 4 + 1) % (V - 4) + 4
    assert not torch.allclose(model(other_src, tgt, src == PAD)[:, 0], out[:, 0])


def test_relative_attention_is_invariant_to_shifting_all_positions():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, 0.0, self_attention=True, relative=3).eval()
    x = torch.randn(2, 9, 32)
    pos = torch.arange(9)
    base = attn(x, mask=CAUSAL, positions=(pos, pos))
    for shift in (1, 17, 500):
        torch.testing.assert_close(attn(x, mask=CAUSAL, positions=(pos + shift, pos + shift)), base)
    # per-sentence positions (as the decoder-only model uses) shift the same way
    rows = torch.stack([pos, pos + 40])
    torch.testing.assert_close(attn(x, mask=CAUSAL, positions=(rows, rows)), base)
    # ... while relative positions do matter: reversing the distances changes the output
    assert not torch.allclose(attn(x, mask=CAUSAL, positions=(-pos, -pos)), base)


def test_decoder_only_reads_one_sequence_and_scores_only_the_target():
    model = make("decoder_only-sinusoidal")
    src, tgt = make_src([5, 3]), torch.randint(4, V, (2, 4))
    assert model(src, tgt, src == PAD).shape == (2, 4, V)  # target positions only
    weights = []
    with torch.no_grad():
        model.decode(tgt, src, src == PAD, weights=weights)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 4, 5)  # target x source
    assert float(weights[0][1, :, :, 3:].abs().max()) == 0.0  # source padding


def test_rnn_attention_weights_are_a_distribution_over_the_source():
    model = make("rnn-bahdanau")
    src, tgt = make_src([5, 3]), torch.randint(4, V, (2, 4))
    weights = []
    with torch.no_grad():
        model.decode(tgt, model.encode(src, src == PAD), src == PAD, weights=weights)
    (w,) = weights
    assert w.shape == (2, 1, 4, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 4))
    assert float(w[1, :, :, 3:].abs().max()) == 0.0


@pytest.mark.parametrize("arch", ["transformer", "decoder_only"])
@pytest.mark.parametrize("installed", [False, True])
def test_act_dropout_is_the_feed_forward_hidden_dropout_alone(arch, installed):
    """model.act_dropout (fairseq's activation_dropout) drops the FFN's hidden activation and
    nothing else, on the reference modules and with the fast paths swapped in. With every
    other dropout 0, act_dropout 0 trains exactly as eval mode computes and 0.5 does not;
    left unset it is model.dropout, so earlier configs and checkpoints train as before."""
    from mt import fast
    from mt.model import REFERENCE

    def out(train, seed=0, **kw):
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(
                arch=arch,
                d_model=32,
                n_heads=4,
                enc_layers=2,
                dec_layers=2,
                d_ff=64,
                max_positions=64,
                **kw,
            ),
            V,
            V,
            fast.PARTS if installed else REFERENCE,
        )
        model.train(train)
        torch.manual_seed(seed)
        src, tgt = make_src([9, 3, 6, 4]), torch.randint(4, V, (4, 8))
        return model(src, tgt, src == PAD)

    plain = {"dropout": 0.0, "attn_dropout": 0.0}
    torch.testing.assert_close(out(True, **plain, act_dropout=0.0), out(False, **plain))
    assert not torch.allclose(out(True, **plain, act_dropout=0.5), out(False, **plain))
    # act_dropout 0 under dropout 0.3: what is left is the residual and embedding dropout
    assert not torch.allclose(out(True, dropout=0.3, act_dropout=0.0), out(False, **plain))
    for seed in (1, 2):
        torch.testing.assert_close(
            out(True, seed, dropout=0.3), out(True, seed, dropout=0.3, act_dropout=0.3)
        )
        assert not torch.allclose(
            out(True, seed, dropout=0.3), out(True, seed, dropout=0.3, act_dropout=0.0)
        )


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["model.arch=transformer", "model.attention=luong"], "model.attention"),
        (["model.arch=rnn", "model.positional=relative"], "model.positional"),
        (["model.arch=gru"], "model.arch"),
        (["model.positional=rotary"], "model.positional"),
        (["model.arch=rnn", "model.act_dropout=0.1"], "model.act_dropout"),
    ],
)
def test_bad_architecture_settings_are_one_line_errors(tmp_path, overrides, needle):
    proc = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "run",
        "--set",
        f"data.dir={tmp_path / 'data'}",
        *overrides,
    )
    assert_user_error(proc, needle)
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "last.pt").exists()


# Through the CLI, each model class and each kind of attention picture (RNN weights, none,
# decoder-only, Transformer) by default; the variants that share those paths with one of them
# (Luong with Bahdanau, learned positions with relative) only in the slow run. The model-level
# contracts above hold for every variant in the default run.
CLI_VARIANTS = [
    "model.arch=rnn model.attention=bahdanau",
    pytest.param("model.arch=rnn model.attention=luong", marks=pytest.mark.slow),
    "model.arch=rnn model.attention=none",
    "model.arch=decoder_only",
    "model.positional=relative",
    pytest.param("model.positional=learned model.norm=post", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("overrides", CLI_VARIANTS)
def test_each_variant_trains_saves_loads_and_translates(tmp_path_factory, overrides):
    base = tmp_path_factory.mktemp("arch")
    run, data = base / "run", tmp_path_factory.getbasetemp() / "arch_data"
    every = ["train.valid_every=12", "train.save_every=6", "train.log_every=6"]
    run_tiny(run, data, "train.max_steps=12", *every, *overrides.split())
    assert (run / "last.pt").is_file() and (run / "best.pt").is_file()
    lines = ["a b c", "", "d e f g h"]
    proc = run_mt("translate", run, "--beam", "2", input="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split("\n")[:-1]) == 3 and proc.stdout.split("\n")[1] == ""
    picture = run_mt("attention", run, "a b c", "-o", base / "attn.png")
    if "attention=none" in overrides:
        assert_user_error(picture, "no attention")
    else:
        assert picture.returncode == 0 and (base / "attn.png").stat().st_size > 0, picture.stderr
    resumed = run_tiny(run, data, "train.max_steps=14", *every, *overrides.split())
    assert "resuming from" in resumed.stdout + resumed.stderr


def test_rnn_recurrence_runs_in_fp32_under_bf16_autocast():
    from mt.config import ModelConfig
    from mt.model import build_model

    seen = []
    for attention in ("bahdanau", "luong", "none"):
        model = build_model(
            ModelConfig(arch="rnn", attention=attention, d_model=16, enc_layers=1, dec_layers=1),
            30,
            30,
        )

        def hook(module, args):
            x = args[0].data if hasattr(args[0], "batch_sizes") else args[0]
            seen.append(
                (
                    torch.is_autocast_enabled("cpu"),
                    x.dtype,
                    None if len(args) < 2 or args[1] is None else args[1].dtype,
                )
            )

        for gru in (model.encoder, model.decoder):
            gru.register_forward_pre_hook(hook)
        src = torch.randint(4, 30, (2, 5))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(src, torch.randint(4, 30, (2, 4)), src == 0)
        assert out.shape[:2] == (2, 4)
    assert seen and all(
        s == (False, torch.float32, s[2]) and s[2] in (None, torch.float32) for s in seen
    ), seen
