"""data.text lc_tok: a run trains on lowercased, Moses-tokenized text (Multi30k's
task1-tokenize.sh), reads its sources so and writes its translations detokenized, so that
`mt eval --lc-tok` scores them as the papers score theirs."""

import random

import sentencepiece as spm
from conftest import ROOT, mt_here

from mt.data.textform import RAW, TextForm
from mt.evaluate.metrics import moses_lc_tokenize

LINES = [
    "A man's dog, running through the snow.",
    'Two children (a boy and a girl) play "tag" outside!',
    "The women's team wins 3-1; everyone cheers.",
    "It costs $5.50 - or so I'm told...",
]


def test_lc_tok_reads_as_task1_tokenize_and_writes_what_it_scores_back():
    form = TextForm("lc_tok", "en", "en")
    assert form.sources(LINES[:1]) == ["a man 's dog , running through the snow ."]
    written = form.outputs(form.targets(LINES))
    assert all(x == x.lower() for x in written)
    assert " ," not in written[0] and written[0].endswith("snow.")
    # what mt eval --lc-tok makes of a translation equals what it makes of the reference
    assert moses_lc_tokenize(written, "en") == moses_lc_tokenize(LINES, "en")
    assert RAW.sources(LINES) == LINES and RAW.outputs(LINES) == LINES


def _corpus(folder, n=400):
    rng = random.Random(0)
    en = ["A man's dog runs.", "The Girl, happy, plays!", "Two dogs (brown) sit."]
    de = ["Ein Hund des Mannes rennt.", "Das Mädchen, fröhlich, spielt!", "Zwei Hunde sitzen."]
    folder.mkdir()
    for split, k in (("train", n), ("valid", 20)):
        picks = [rng.randrange(3) for _ in range(k)]
        (folder / f"{split}.en").write_text("".join(en[i] + "\n" for i in picks))
        (folder / f"{split}.de").write_text("".join(de[i] + "\n" for i in picks))


def test_a_lc_tok_run_learns_lowercased_tokens_and_translates_detokenized(tmp_path):
    _corpus(tmp_path / "d")
    sets = [
        f"data.dir={tmp_path / 'd'}",
        "data.src_lang=en",
        "data.tgt_lang=de",
        "data.text=lc_tok",
        "train.max_steps=60",
        "train.valid_every=60",
        "train.device=cpu",
        "tokenizer.vocab_size=120",
        "train.lr_factor=3",
    ]
    code, _, err = mt_here(
        "train", ROOT / "configs/tiny.yaml", "--run-dir", tmp_path / "r", "--set", *sets
    )
    assert code == 0, err
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "r/spm.model"))
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
    assert not any(p != p.lower() for p in pieces)  # (BPE learnt lowercased text)
    assert "▁," in pieces  # (the comma a token of its own)
    (tmp_path / "in.en").write_text("A MAN'S DOG RUNS.\n")
    code, out, err = mt_here(
        "translate", tmp_path / "r", "-i", tmp_path / "in.en", "--device", "cpu"
    )
    assert code == 0, err
    assert out.strip() == out.strip().lower() and " ." not in out, out
    from mt.decode.translator import Translator

    t = Translator.load(tmp_path / "r", "cpu")
    read = t.tokenizer.encode_src(["a man 's dog runs ."])
    assert t.source_ids(["A MAN'S DOG RUNS."]) == read  # (sources read as training read them)


def test_lc_tok_is_refused_where_it_cannot_hold(tmp_path):
    tiny = ROOT / "configs/tiny.yaml"
    code, _, err = mt_here(
        "train",
        tiny,
        "--run-dir",
        tmp_path / "r",
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "data.text=lc_tok",
    )
    assert code == 2 and "Moses" in err and "'src'" in err, err  # (the toy task's languages)
    several = ROOT / "configs/multi30k_en_x.yaml"
    code, _, err = mt_here(
        "train", several, "--run-dir", tmp_path / "r", "--set", "data.text=lc_tok"
    )
    assert code == 2 and "data.text lc_tok" in err and "data.pairs" in err, err
