"""transformers' Marian models: a run exported for `transformers` computes and translates as mt
does, loaded by transformers alone; a Marian model that follows OPUS-MT's conventions,
imported with model.init_from, computes as transformers does, fine-tunes and exports back."""

import gzip
import json

import pytest
import torch

from mt.tokens import BOS, EOS, PAD
from tests.conftest import MULTI30K, ROOT, mt_here
from tests.marian_models import make_opus_like

transformers = pytest.importorskip("transformers")
needs_multi30k = pytest.mark.skipif(
    not MULTI30K.is_dir(), reason="real Multi30k not found at ../shared/data/multi30k"
)


def _lines(name: str, n: int) -> list[str]:
    with gzip.open(MULTI30K / f"{name}.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def _corpus(folder, n_train: int = 10000, n_valid: int = 60):
    """A Multi30k De-En sample as a data.dir: train and valid splits."""
    folder.mkdir(parents=True, exist_ok=True)
    for side in ("de", "en"):
        (folder / f"train.{side}").write_text("\n".join(_lines(f"train.{side}", n_train)) + "\n")
        (folder / f"valid.{side}").write_text("\n".join(_lines(f"val.{side}", n_valid)) + "\n")
    return folder


def _batch(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def logits_gap(model, tokenizer, hf, hf_tok, sources, targets, orders=None) -> float:
    """max |mt's teacher-forced logit - transformers'| over the real target positions of the
    pairs (sources: text; targets: mt's target ids), both models on the same tokens; orders:
    (source, target) mt's id -> the Marian model's (None: the same ids)."""
    c = hf.config
    if orders is None:
        orders = (range(c.vocab_size), range(c.decoder_vocab_size))
    src_order, order = (torch.tensor(list(o)) for o in orders)
    src = _batch([[*ids, EOS] for ids in tokenizer.encode_src(sources)])
    tgt_in = _batch([[BOS, *ids] for ids in targets])
    enc = hf_tok(sources, return_tensors="pt", padding=True)
    assert torch.equal(
        src_order[src].masked_fill(src == PAD, 0),
        enc["input_ids"].masked_fill(enc["attention_mask"] == 0, 0),
    )
    with torch.no_grad():
        ours = model.eval()(src, tgt_in, src == PAD)  # (B, T, mt's V)
        theirs = hf.eval()(**enc, decoder_input_ids=order[tgt_in]).logits  # (B, T, V)
    real = torch.ones_like(tgt_in, dtype=torch.bool)
    for i, ids in enumerate(targets):
        real[i, len(ids) + 1 :] = False
    return (ours - theirs[..., order])[real].abs().max().item()


def check_transformers_translates_as_mt(run, out, sources: list[str], limit: int = 200) -> None:
    """transformers alone, on the folder `mt export --format transformers` wrote: the same
    token ids as mt's tokenizer, teacher-forced logits within 1e-4, and the same translations
    greedy and with the run's beam and length penalty. Both searches get the same length limit
    for every sentence (`limit` tokens, </s> included; transformers has one limit per batch,
    mt one per sentence), so that a sentence that loops ends alike on both sides."""
    from transformers import MarianMTModel, MarianTokenizer

    from mt.decode.translator import Translator

    hf, hf_tok = MarianMTModel.from_pretrained(out), MarianTokenizer.from_pretrained(out)
    t = Translator.load(run, "cpu")
    ids = hf_tok(sources)["input_ids"]
    assert ids == [[*x, EOS] for x in t.tokenizer.encode_src(sources)]
    same_limit = {"max_len_a": 0, "max_len_b": limit}
    greedy = t.search(sources, beam=1, **same_limit)
    outputs = [found[1][0][0] for found in greedy]
    assert logits_gap(t.model, t.tokenizer, hf, hf_tok, sources, outputs) < 1e-4
    assert hf.generation_config.num_beams == t.cfg.beam
    assert hf.generation_config.length_penalty == t.cfg.length_penalty
    enc = hf_tok(sources, return_tensors="pt", padding=True)
    for beam in (1, t.cfg.beam):
        ours = t.translate(sources, beam=beam, **same_limit)
        with torch.no_grad():  # (max_length counts the decoder's start token)
            gen = hf.generate(**enc, num_beams=beam, max_length=limit + 1)
        theirs = hf_tok.batch_decode(gen, skip_special_tokens=True)
        assert theirs == ours, [(a, b) for a, b in zip(theirs, ours, strict=True) if a != b][:3]


@pytest.fixture(scope="module")
def m30k_run(tmp_path_factory):
    """A small post-LN Transformer trained briefly on a Multi30k De-En sample, in this
    process, with the length penalty its decode section keeps."""
    if not MULTI30K.is_dir():
        pytest.skip("real Multi30k not found at ../shared/data/multi30k")
    base = tmp_path_factory.mktemp("m30k")
    code, _, err = mt_here(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        base / "run",
        "--set",
        f"data.dir={_corpus(base / 'data')}",
        "data.src_lang=de",
        "data.tgt_lang=en",
        "data.dataset=null",
        "tokenizer.vocab_size=1000",
        "model.norm=post",
        "train.max_steps=500",
        "train.warmup=100",
        "train.valid_every=500",
        "train.save_every=500",
        "train.valid_beam=1",
        "decode.tune_beams=[]",
        "decode.beam=5",
        "decode.length_penalty=1.3",
        "train.device=cpu",
    )
    assert code == 0, err
    return base / "run"


@needs_multi30k
def test_an_exported_run_translates_in_transformers_as_in_mt(m30k_run, tmp_path):
    out = tmp_path / "de-en"
    code, _, err = mt_here("export", m30k_run, out, "--format", "transformers")
    assert code == 0, err
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "vocab.json",
        "tokenizer_config.json",
        "README.md",
    } <= names
    config = json.loads((out / "config.json").read_text())
    assert config["scale_embedding"] and config["decoder_start_token_id"] == BOS
    assert config["forced_eos_token_id"] == EOS and config["activation_function"] == "relu"
    card = (out / "README.md").read_text()
    assert "license:" in card and "Not evaluated" in card and "mt train" in card
    # with the scores of mt eval --json, the card shows them with their signatures
    test_de, test_en = tmp_path / "test.de", tmp_path / "test.en"
    test_de.write_text("\n".join(_lines("test_2016_flickr.de", 50)) + "\n")
    test_en.write_text("\n".join(_lines("test_2016_flickr.en", 50)) + "\n")
    code, scores, err = mt_here("eval", m30k_run, "--src", test_de, "--ref", test_en, "--json")
    assert code == 0, err
    (tmp_path / "scores.json").write_text(scores)
    code, _, err = mt_here(
        "export",
        m30k_run,
        tmp_path / "scored",
        "--format",
        "transformers",
        "--scores",
        tmp_path / "scores.json",
    )
    assert code == 0, err
    card = (tmp_path / "scored" / "README.md").read_text()
    bleu = json.loads(scores)
    check_card_renders(card, bleu, test_set="test")
    assert str(tmp_path) not in card and str(m30k_run) not in card  # no local path
    check_transformers_translates_as_mt(m30k_run, out, _lines("test_2016_flickr.de", 50))

    # mt -> transformers -> mt leaves every weight equal (and the run's model settings)
    from mt.artifacts import checkpoint
    from mt.hub.imports import Imported

    trained = checkpoint.open_trained(m30k_run)
    back = Imported(str(out))
    fixed = back.settings()
    assert fixed["model.output_bias"] is False
    assert all(getattr(trained.config.model, k[6:]) == v for k, v in fixed.items() if "model." in k)
    assert back.tokenizer.pieces("tgt") == trained.tokenizer.pieces("tgt")
    ours, theirs = trained.model.state_dict(), back.weights(output_bias=False)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize(
    "tie,joint,activation",
    [
        ("all", True, "relu"),
        ("decoder", False, "gelu"),
        ("none", False, "swish"),
        ("none", True, "relu"),
    ],
)
def test_tie_modes_and_separate_vocabularies_survive_save_and_load(
    tmp_path, tie, joint, activation
):
    """Through save_pretrained and from_pretrained: transformers' logits equal mt's, and the
    weights read back equal mt's, for each embedding tie, one vocabulary or two, each
    activation, with an output bias."""
    from transformers import MarianMTModel

    from mt.hub.export import marian_config
    from mt.hub.marian import from_marian, tie_mode, to_marian
    from mt.model import LayerShape, Transformer

    src_v, tgt_v = (60, 60) if joint else (60, 45)
    torch.manual_seed(0)
    model = Transformer(
        src_vocab=src_v,
        tgt_vocab=tgt_v,
        shape=LayerShape(d_model=32, n_heads=4, d_ff=48, dropout=0.0, activation=activation),
        enc_layers=2,
        dec_layers=3,
        tie_embeddings=tie,
        max_positions=64,
        output_bias=True,
    ).eval()
    with torch.no_grad():
        model.output_bias.normal_()

    class Sizes:  # what marian_config reads of a tokenizer
        src_vocab_size, tgt_vocab_size = src_v, tgt_v

    from mt.config import load_config

    cfg = load_config(
        "tiny",
        [
            "model.norm=post",
            f"model.tie_embeddings={tie}",
            f"tokenizer.joint={joint}",
            f"model.activation={activation}",
            "model.d_ff=48",
            "model.d_model=32",
            "model.dec_layers=3",
            "model.max_positions=64",
        ],
    )
    hf = MarianMTModel(marian_config(transformers, cfg, Sizes()))
    missing, unexpected = hf.load_state_dict(to_marian(model.state_dict(), 2, 3, tie), False)
    assert not unexpected and all("embed_positions" in k for k in missing)
    hf.save_pretrained(tmp_path / "m")
    hf = MarianMTModel.from_pretrained(tmp_path / "m").eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, src_v, (3, 9), generator=g)
    src[:, -1], src[0, 6:] = EOS, PAD
    src[0, 5] = EOS
    tgt = torch.randint(4, tgt_v, (3, 7), generator=g)
    tgt[:, 0] = BOS
    with torch.no_grad():
        ours = model(src, tgt, src == PAD)
        theirs = hf(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt)
    assert (ours - theirs.logits).abs().max() < 1e-4
    c = hf.config
    assert tie_mode(c.share_encoder_decoder_embeddings, c.tie_word_embeddings) == tie
    back = from_marian(hf.state_dict(), 2, 3, tie, torch.arange(src_v), torch.arange(tgt_v), True)
    state = model.state_dict()
    assert state.keys() == back.keys()
    assert all(torch.equal(state[k], back[k]) for k in state)


@pytest.fixture(scope="module")
def opus_like(tmp_path_factory):
    """An OPUS-MT-like Marian model with random weights, made here (tests/marian_models.py)."""
    if not MULTI30K.is_dir():
        pytest.skip("real Multi30k not found at ../shared/data/multi30k")
    base = tmp_path_factory.mktemp("opus")
    return make_opus_like(base / "model", _lines("train.de", 3000), _lines("train.en", 3000))


def _finetune_config(path, model, data, *more: str):
    lines = [
        "data:",
        f"  dir: {data}",
        "  src_lang: de",
        "  tgt_lang: en",
        "model:",
        f"  init_from: {model}",
        "  dropout: 0.0",
        *more,
        "train:",
        "  max_steps: 20",
        "  max_tokens: 2000",
        "  warmup: 10",
        "  log_every: 5",
        "  valid_every: 20",
        "  save_every: 20",
        "  device: cpu",
        "decode:",
        "  beam: 2",
        "  tune_beams: []",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@needs_multi30k
def test_an_opus_mt_like_model_imports_computes_as_transformers_and_fine_tunes(opus_like, tmp_path):
    from transformers import MarianMTModel, MarianTokenizer

    from mt.decode.translator import Translator
    from mt.hub.imports import imported
    from mt.model import build_model
    from mt.train.build import load_run_config

    hf = MarianMTModel.from_pretrained(opus_like).eval()
    hf_tok = MarianTokenizer.from_pretrained(opus_like)
    data = _corpus(tmp_path / "data", n_train=2000)
    cfg = load_run_config(_finetune_config(tmp_path / "ft.yaml", opus_like, data))
    m = cfg.model
    assert (m.activation, m.output_bias, m.tie_embeddings, m.d_model) == ("swish", True, "all", 32)
    imp = imported(str(opus_like))
    tok = imp.tokenizer
    pad = hf.config.pad_token_id
    # mt's ids: the model's pad, <unk>, decoder start (its pad again) and </s> first
    assert [imp.tgt_order[i] for i in range(4)] == [pad, 1, pad, 0]
    model = build_model(m, tok.src_vocab_size, tok.tgt_vocab_size)
    model.load_state_dict(imp.weights(m.output_bias))
    sources, refs = _lines("val.de", 100), _lines("val.en", 100)
    sources[7] = ">>fr<< " + sources[7]  # (a target-language token: one piece, as Marian's)
    # the vocabulary's ids are not the sentencepiece models': a test that they are mapped
    sp_ids = imp.tokenizer.src.Encode(sources[:5])
    assert [[imp.src_order[i] for i in x] for x in tok.encode_src(sources[:5])] != sp_ids
    orders = (imp.src_order, imp.tgt_order)
    gap = logits_gap(model, tok, hf, hf_tok, sources, tok.encode_tgt(refs), orders)
    assert gap < 1e-4, gap

    # greedy: the same outputs, with the same limit (30 tokens, </s> included) on both sides
    t = Translator(model, tok, cfg.decode, torch.device("cpu"))
    found = t.search(sources, beam=1, max_len_a=0, max_len_b=30)
    ours = [[imp.tgt_order[i] for i in f[1][0][0]] for f in found]
    enc = hf_tok(sources, return_tensors="pt", padding=True)
    with torch.no_grad():  # (mt never emits <unk>: banned here too)
        gen = hf.generate(**enc, num_beams=1, max_length=31, bad_words_ids=[[pad], [1]])
    theirs = [[i for i in row.tolist()[1:] if i not in (0, pad)] for row in gen]
    assert ours == theirs
    assert len({tuple(x) for x in ours}) > 10 and min(map(len, ours)) < 29  # (not one output)

    # a short fine-tune trains and translates, and its export loads back with equal logits
    run = tmp_path / "run"
    code, _, err = mt_here("train", tmp_path / "ft.yaml", "--run-dir", run)
    assert code == 0, err
    losses = [
        json.loads(x).get("loss")
        for x in (run / "train_log.jsonl").read_text().split("\n")
        if x and "loss" in json.loads(x) and "valid_loss" not in json.loads(x)
    ]
    assert losses[-1] < losses[0], losses
    code, out, err = mt_here("translate", run, input="\n".join(sources[:5]) + "\n")
    assert code == 0 and len(out.splitlines()) == 5, err
    code, _, err = mt_here("export", run, tmp_path / "back", "--format", "transformers")
    assert code == 0, err
    card = (tmp_path / "back" / "README.md").read_text()
    assert f"started from {opus_like.name} (model.init_from)" in card  # (its name: no path)
    assert str(opus_like) not in card and "base_model" not in card  # (a local folder)
    tuned = Translator.load(run, "cpu")
    code, _, err = mt_here("attention", run, sources[0], "-o", tmp_path / "a.png")
    assert code == 0 and (tmp_path / "a.png").is_file(), err
    _ct2_translates_as_mt(run, tmp_path / "ct2", tuned, sources[:20])
    back = MarianMTModel.from_pretrained(tmp_path / "back")
    back_tok = MarianTokenizer.from_pretrained(tmp_path / "back")
    targets = tuned.tokenizer.encode_tgt(refs[:20])
    assert logits_gap(tuned.model, tuned.tokenizer, back, back_tok, sources[:20], targets) < 1e-4


def _refused(*args, needles=()):
    code, out, err = mt_here(*args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


@needs_multi30k
def test_what_cannot_be_imported_or_exported_is_one_line(opus_like, tiny_run, tmp_path):
    data = _corpus(tmp_path / "data", n_train=50, n_valid=5)
    not_a_model = tmp_path / "folder"
    not_a_model.mkdir()
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert"}')
    for source, needle in [
        (not_a_model, "no config.json"),
        (bert, "is a bert model"),
        ("Helsinki-NLP/opus-mt-de-en", "hf download"),
        ("no/such/folder/here", "no such folder"),
    ]:
        config = _finetune_config(tmp_path / "c.yaml", source, data)
        _refused("train", config, "--run-dir", tmp_path / "r", needles=[str(source), needle])
    assert not (tmp_path / "r").exists()
    # a config that says otherwise than the imported model, or sets the tokenizer it brings
    for more, needle in [
        ("  d_model: 64", "model.d_model is 64"),
        ("tokenizer:\n  vocab_size: 500\n", "tokenizer.vocab_size is 500"),
        ("  activation: relu", "model.activation is relu"),
    ]:
        config = _finetune_config(tmp_path / "c.yaml", opus_like, data, more)
        _refused("train", config, "--run-dir", tmp_path / "r", needles=[needle, "remove"])
    config = _finetune_config(tmp_path / "c.yaml", opus_like, data)
    _refused(
        "train",
        config,
        "--run-dir",
        tmp_path / "r",
        "--set",
        "tokenizer.character_coverage=0.9",
        needles=["tokenizer.character_coverage", "brings its own tokenizer"],
    )
    # what a Marian model cannot hold (tiny_run is pre-LN), and flags of the other format
    (tmp_path / "s.json").write_text("BLEU = 30")
    to_x = ("export", tiny_run, tmp_path / "x", "--format")
    for more, needle in [
        ((), "model.norm pre"),
        (("--quantization", "int8"), "--quantization"),
        (("--scores", tmp_path / "s.json"), "mt eval --json"),
        (("--license", "my license"), "hub license id"),
    ]:
        _refused(*to_x, "transformers", *more, needles=[needle])
    _refused(*to_x, "onnx", needles=["transformers"])
    assert not (tmp_path / "x").exists()
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("kept")
    _refused("export", tiny_run, tmp_path / "x", "--format", "transformers", needles=["--force"])
    assert (tmp_path / "x" / "mine.txt").read_text() == "kept"


@needs_multi30k
@pytest.mark.parametrize("joint", [True, False])
def test_the_exported_tokenizer_encodes_and_decodes_as_mt(tmp_path, joint):
    """MarianTokenizer on the files the export writes: mt's ids for sources and targets (one
    vocabulary, or a source and a target one), and mt's text for target ids."""
    from transformers import MarianTokenizer

    from mt.data.tokenizer import Tokenizer
    from mt.hub.export import _write_tokenizer

    de, en = _lines("train.de", 2000), _lines("train.en", 2000)
    tok = Tokenizer.train(
        de, en, vocab_size=400, joint=joint, character_coverage=1.0, max_sentences=2000, seed=0
    )
    _write_tokenizer(transformers, tok, tmp_path, ("de", "en"))
    assert (tmp_path / "target_vocab.json").is_file() != joint
    hf = MarianTokenizer.from_pretrained(tmp_path)
    sources, targets = _lines("val.de", 30), _lines("val.en", 30)
    assert hf(sources)["input_ids"] == [[*x, EOS] for x in tok.encode_src(sources)]
    ids = tok.encode_tgt(targets)
    assert hf(text_target=targets)["input_ids"] == [[*x, EOS] for x in ids]
    assert hf.batch_decode(ids, skip_special_tokens=True) == tok.decode_tgt(ids)
    # the direction is said in tokenizer_config.json, where an import checks it
    assert (hf.init_kwargs["source_lang"], hf.init_kwargs["target_lang"]) == ("de", "en")


def _ct2_translates_as_mt(run, out, translator, sources) -> None:
    """The run exported to CTranslate2 (swish, an output bias, the model's own vocabulary)
    gives mt's greedy outputs, the same limit on both sides."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    code, _, err = mt_here("export", run, out)
    assert code == 0, err
    tok = translator.tokenizer
    pieces = [tok.src_pieces_of(ids) for ids in tok.encode_src(sources)]
    model = ctranslate2.Translator(str(out), device="cpu")
    found = model.translate_batch(pieces, beam_size=1, max_decoding_length=29)
    index = {piece: i for i, piece in enumerate(tok.pieces("tgt"))}
    theirs = [[index[p] for p in r.hypotheses[0]] for r in found]
    ours = [f[1][0][0] for f in translator.search(sources, beam=1, max_len_a=0, max_len_b=30)]
    assert theirs == ours


@needs_multi30k
def test_an_imported_folder_is_checked_before_it_is_used(opus_like, tmp_path):
    """Every file model.init_from reads is named when missing (no TypeError from deep inside
    transformers), a vocabulary that numbers pieces past the model's size and a direction
    that contradicts tokenizer_config.json are refused, and a mistyped local path is never
    looked up on the hub."""
    import json
    import shutil

    data = _corpus(tmp_path / "data", n_train=50, n_valid=5)

    def variant(name, change):
        folder = tmp_path / name
        shutil.copytree(opus_like, folder)
        change(folder)
        return folder

    def drop(*names):
        return lambda f: [(f / n).unlink() for n in names]

    def vocab_past_its_size(f):
        vocab = json.loads((f / "vocab.json").read_text(encoding="utf-8"))
        vocab["▁extra"] = max(vocab.values()) + 5
        (f / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")

    def english_to_german(f):
        tc = json.loads((f / "tokenizer_config.json").read_text(encoding="utf-8"))
        tc.update(source_lang="en", target_lang="de")
        (f / "tokenizer_config.json").write_text(json.dumps(tc), encoding="utf-8")

    cases = [
        (variant("no_tok", drop("source.spm", "target.spm", "vocab.json")),
         ["lacks source.spm, target.spm, vocab.json"]),
        (variant("no_vocab", drop("vocab.json")), ["lacks vocab.json"]),
        (variant("no_weights", drop("model.safetensors")), ["lacks model.safetensors or"]),
        (variant("past", vocab_past_its_size), ["'▁extra'", "vocabulary size"]),
        (variant("en_de", english_to_german), ["translates en -> de", "data is de-en"]),
        ("tests/no_such_model", ["no such folder", str(ROOT)]),
    ]  # fmt: skip
    for source, needles in cases:
        config = _finetune_config(tmp_path / "c.yaml", source, data)
        _refused("train", config, "--run-dir", tmp_path / "r", needles=[str(source), *needles])
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def opus_multi(tmp_path_factory):
    """A multilingual OPUS-MT-like model: German sources, English and French targets asked
    for by a leading >>en<< or >>fr<< (its tokenizer_config.json names groups, as en-mul's)."""
    if not MULTI30K.is_dir():
        pytest.skip("real Multi30k not found at ../shared/data/multi30k")
    base = tmp_path_factory.mktemp("opus_multi")
    target = _lines("train.en", 1500) + _lines("train.fr", 1500)
    return make_opus_like(base / "model", _lines("train.de", 3000), target, seed=2,
                          codes=("en", "fr"), source_lang="gmw", target_lang="mul")  # fmt: skip


@needs_multi30k
def test_a_multilingual_model_fine_tunes_with_its_target_token(opus_multi, opus_like, tmp_path):
    """A multilingual Marian model imported for one of its directions: the run's sources,
    in training and in mt translate, start with the target's token (data.target_token, which
    the import sets), so mt translates as transformers does with the token written; a target
    it has no token for, or several targets asked of a model without tokens, one line."""
    from transformers import MarianMTModel, MarianTokenizer

    from mt.data.prepare import train_split
    from mt.hub.imports import imported
    from mt.runtime.distributed import Dist
    from mt.train.build import load_run_config

    data = _corpus(tmp_path / "data", n_train=200, n_valid=20)
    more = ("decode:\n  max_len_a: 0\n  max_len_b: 30\ntrain:\n  lr_factor: 1.0e-9\n"
            "  max_steps: 2\n  valid_every: 2\n  save_every: 2\n  device: cpu")  # fmt: skip
    config = tmp_path / "ft.yaml"
    config.write_text(f"data:\n  dir: {data}\n  src_lang: de\n  tgt_lang: en\n"
                      f"model:\n  init_from: {opus_multi}\n{more}\n")  # fmt: skip
    cfg = load_run_config(config)
    assert cfg.data.target_token is True
    tok = imported(str(opus_multi)).tokenizer
    train = train_split(cfg, tok, Dist(), lambda *_: None, 0.0)
    lead = tok.encode_src([">>en<< x"])[0][0]
    assert {int(train.src[i][0]) for i in range(len(train.src))} == {lead}
    run = tmp_path / "run"
    code, _, err = mt_here("train", config, "--run-dir", run, "--set", "train.average_last=0")
    assert code == 0, err
    sources = _lines("val.de", 40)
    code, out, err = mt_here("translate", run, "--greedy", input="\n".join(sources) + "\n")
    assert code == 0, err
    hf = MarianMTModel.from_pretrained(opus_multi).eval()
    hf_tok = MarianTokenizer.from_pretrained(opus_multi)
    pad = hf.config.pad_token_id

    def theirs(lines: list[str]) -> list[str]:
        enc = hf_tok(lines, return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = hf.generate(**enc, num_beams=1, max_length=31, bad_words_ids=[[pad], [1]])
        return hf_tok.batch_decode(gen, skip_special_tokens=True)

    assert out.splitlines() == theirs([">>en<< " + s for s in sources])
    assert len(set(out.splitlines())) > 10  # (not one output for every source)
    assert out.splitlines() != theirs(sources)  # (the token changes what it writes)
    assert out.splitlines() != theirs([">>fr<< " + s for s in sources])

    (data / "train.cs").write_text((data / "train.en").read_text())
    (data / "valid.cs").write_text((data / "valid.en").read_text())
    _refused("train", config, "--run-dir", tmp_path / "r", "--set", "data.tgt_lang=cs",
             needles=["no token for cs (>>cs<<)", ">>en<<, >>fr<<"])  # fmt: skip
    _refused("train", config, "--run-dir", tmp_path / "r", "--set", "data.target_token=false",
             needles=["data.target_token is False", "remove"])  # fmt: skip
    bilingual = _finetune_config(tmp_path / "b.yaml", opus_like, data)
    _refused("train", bilingual, "--run-dir", tmp_path / "r", "--set", "data.pairs=[de-en,de-cs]",
             needles=["no target-language tokens", "for cs, en"])  # fmt: skip
    assert not (tmp_path / "r").exists()


def check_card_renders(card: str, scores: dict, test_set: str) -> None:
    """The card as the hub reads it: a YAML header with the keys its pages use, and a scores
    table whose every row has its three cells (a signature's | escaped), rendered by a
    Markdown parser (markdown-it, GitHub's tables)."""
    import yaml
    from markdown_it import MarkdownIt

    _, header, body = card.split("---\n", 2)
    meta = yaml.safe_load(header)
    assert {"license", "language", "datasets", "metrics", "model-index"} <= set(meta), meta
    assert meta["license"] == "unknown" and meta["language"] == ["de", "en"]
    (entry,) = meta["model-index"]
    (result,) = entry["results"]
    assert result["dataset"]["name"] == test_set and result["task"]["type"] == "translation"
    got = {m["type"]: m["value"] for m in result["metrics"]}
    assert got["bleu"] == round(scores["bleu"], 2) and "chrf" in got and "ter" in got
    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    rows, cells = [], 0
    for tok in tokens:
        if tok.type == "tr_close":
            rows.append(cells)
            cells = 0
        cells += tok.type in ("th_open", "td_open")
    assert len(rows) == 5 and set(rows) == {3}, rows  # header, BLEU, chrF, chrF++, TER
    inline = [t.content for t in tokens if t.type == "inline"]
    assert any(scores["bleu_signature"] in c.replace("\\|", "|") for c in inline)
