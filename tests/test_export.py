"""`mt export --to ctranslate2`: the exported model decodes as mt does."""

import pytest

from mt.data.synthetic import generate
from mt.decode.translator import Translator
from tests.conftest import ROOT, assert_user_error, run_mt, run_tiny

ctranslate2 = pytest.importorskip("ctranslate2")


def _ct2_greedy(out, translator, lines, compute_type="default"):
    """CTranslate2's greedy outputs, each sentence with mt's length limit (a * source + b
    tokens, EOS included)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    model = ctranslate2.Translator(str(out), device="cpu", compute_type=compute_type)
    cfg, hyps = translator.cfg, []
    for line in lines:
        pieces = sp.encode(line, out_type=str)
        limit = int((len(pieces) + 1) * cfg.max_len_a + cfg.max_len_b)
        r = model.translate_batch([pieces], beam_size=1, max_decoding_length=limit - 1)
        hyps.append(sp.decode(r[0].hypotheses[0]))
    return hyps


def test_exported_model_decodes_as_mt(tiny_run, tmp_path):
    out = tmp_path / "ct2"
    proc = run_mt("export", tiny_run, out)
    assert proc.returncode == 0, proc.stderr
    assert {"model.bin", "spm.model", "config.json", "mt_export.json"} <= {
        p.name for p in out.iterdir()
    }
    t = Translator.load(tiny_run, "cpu")
    src, _ = generate(40, seed=9)
    assert _ct2_greedy(out, t, src) == t.translate(src, beam=1)
    # int8: the weights are stored in a byte each (a quarter of the size, plus the scales
    # and the fp32 norms and biases), and decoded from those bytes the translations nearly
    # all agree (on 200 sentences of this run: 188). The agreement is checked with the int8
    # weights computed in fp32: CTranslate2's int8 matrix products are its own and differ by
    # CPU (on an AVX2 CPU without VNNI, 24 of these 40 agreed in int8 and 37 in fp32), and
    # this barely trained model's close logits flip with them.
    proc = run_mt("export", tiny_run, tmp_path / "int8", "--quantization", "int8")
    assert proc.returncode == 0, proc.stderr
    size = {d: (tmp_path / d / "model.bin").stat().st_size for d in ("ct2", "int8")}
    assert size["int8"] < 0.45 * size["ct2"], size
    ours = t.translate(src, beam=1)
    from_bytes = _ct2_greedy(tmp_path / "int8", t, src, compute_type="float32")
    agree = sum(a == b for a, b in zip(from_bytes, ours, strict=True))
    assert agree >= 0.85 * len(src), agree
    assert len(_ct2_greedy(tmp_path / "int8", t, src[:5], compute_type="int8")) == 5  # it runs


def test_export_refuses_what_it_cannot_represent_and_keeps_files(tiny_run, tmp_path):
    out = tmp_path / "ct2"
    assert run_mt("export", tiny_run, out).returncode == 0
    assert_user_error(run_mt("export", tiny_run, out), "already exists", "--force")
    assert run_mt("export", tiny_run, out, "--force").returncode == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert_user_error(run_mt("export", tiny_run, mine, "--force"), "not an exported model")
    assert (mine / "notes.txt").read_text() == "keep"
    assert_user_error(
        run_mt("export", tiny_run, tmp_path / "q", "--quantization", "int3"), "--quantization int3"
    )
    rnn = tmp_path / "rnn"
    proc = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        rnn,
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "model.arch=rnn",
        "train.max_steps=2",
    )
    assert proc.returncode == 0, proc.stderr
    assert_user_error(run_mt("export", rnn, tmp_path / "r"), "model.arch rnn")


def test_post_norm_and_learned_positions_export_too(tmp_path):
    run = tmp_path / "post"
    shape = ["model.norm=post", "model.positional=learned"]
    run_tiny(run, tmp_path / "d", *shape, "train.max_steps=60", "train.valid_every=60")
    assert run_mt("export", run, tmp_path / "ct2").returncode == 0
    t = Translator.load(run, "cpu")
    src, _ = generate(30, seed=10)
    assert _ct2_greedy(tmp_path / "ct2", t, src) == t.translate(src, beam=1)
