import gzip
import json
import time

import numpy as np
import pytest

from mt.data.batching import collate, token_batches
from mt.data.corpus import Stats, drop_empty, encode_pairs, read_lines, read_parallel
from mt.data.download import download, from_datasets
from mt.data.tokenizer import BOS, EOS, PAD, Tokenizer
from mt.errors import MTError
from tests.conftest import MULTI30K, ROOT, assert_user_error, mt_here, run_mt, train_tiny


def _write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(x + "\n" for x in lines))


def test_import_multi30k_raw_layout(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 5), ("val", 3), ("test_2016_flickr", 2)):
        _write_gz(raw / f"{split}.en.gz", [f"{split} en {i}" for i in range(n)])
        _write_gz(raw / f"{split}.de.gz", [f"{split} de {i}" for i in range(n)])
    _write_gz(raw / "test_2017_flickr.en.gz", ["other test set"])  # not test_2016: ignored
    counts = download("multi30k", tmp_path / "out", from_path=raw)
    assert counts == {"train": 5, "valid": 3, "test": 2}
    assert read_lines(tmp_path / "out/valid.de") == [f"val de {i}" for i in range(3)]
    assert read_lines(tmp_path / "out/test.en") == [
        "test_2016_flickr en 0",
        "test_2016_flickr en 1",
    ]


@pytest.mark.skipif(
    not MULTI30K.is_dir(), reason="real Multi30k not found at ../shared/data/multi30k"
)
def test_import_real_multi30k(tmp_path):
    proc = run_mt("download", "multi30k", "--from-dir", MULTI30K, "--out", tmp_path / "m")
    assert proc.returncode == 0, proc.stderr
    assert len(read_lines(tmp_path / "m/train.de")) == 29000
    assert len(read_lines(tmp_path / "m/valid.en")) == 1014
    assert len(read_lines(tmp_path / "m/test.en")) == 1000


def test_import_plain_splits_and_refuse_overwrite(tmp_path):
    src = tmp_path / "plain"
    src.mkdir()
    for split in ("train", "dev", "test"):
        (src / f"{split}.fr").write_text("a\nb\n")
        (src / f"{split}.en").write_text("x\ny\n")
    assert download("local", tmp_path / "o", from_path=src) == {"train": 2, "valid": 2, "test": 2}
    before = (tmp_path / "o/train.fr").read_text()
    with pytest.raises(MTError, match="already exists; pass --force"):
        download("local", tmp_path / "o", from_path=src)
    assert (tmp_path / "o/train.fr").read_text() == before


def test_import_local_datasets_objects(tmp_path):
    datasets = pytest.importorskip("datasets")
    # multi30k style: one column per language
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"en": ["a b", "c\nd"], "de": ["A B", "C D"]}),
            "validation": datasets.Dataset.from_dict({"en": ["e"], "de": ["E"]}),
        }
    )
    splits = from_datasets(dd)
    assert splits["valid"] == {"en": ["e"], "de": ["E"]}
    # wmt style: a translation column of dicts, round-tripped through save_to_disk
    wmt = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"translation": [{"de": "Hallo", "en": "Hello"}, {"de": "Welt", "en": "World"}]}
            ),
            "test": datasets.Dataset.from_dict({"translation": [{"de": "Ja", "en": "Yes"}]}),
        }
    )
    wmt.save_to_disk(str(tmp_path / "wmt"))
    counts = download("wmt14", tmp_path / "out", from_path=tmp_path / "wmt", langs=("en", "de"))
    assert counts == {"train": 2, "test": 1}
    assert read_lines(tmp_path / "out/train.de") == ["Hallo", "Welt"]
    # an embedded newline must not shift later lines
    from mt.data.download import write_splits

    write_splits(splits, tmp_path / "out2", force=False)
    assert read_lines(tmp_path / "out2/train.en") == ["a b", "c d"]


def test_hub_failure_points_to_from_dir(tmp_path):
    t0 = time.time()
    proc = run_mt("download", "multi30k", "--out", tmp_path / "o")
    assert_user_error(proc, "--from-dir", "bentrevett/multi30k")
    assert time.time() - t0 < 60


def test_an_unreachable_hub_is_known_in_seconds_and_its_cache_read(tmp_path, monkeypatch):
    """Without HF_HUB_OFFLINE, a hub that cannot be reached (here: a closed local port) is
    known from one request: the download fails in one line within seconds (the libraries
    retried for half a minute), saying so; a hub that answers at all, even 404, is reached."""
    import http.server
    import threading

    from mt.data.download import _unreachable_hub
    from tests.conftest import free_port

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    code, _, err = mt_here("download", "wmt14", "--config", "de-en", "--out", tmp_path / "o")
    assert code == 2 and err.count("\n") == 1, err
    assert "the hub cannot be reached" in err and "--from-dir" in err, err
    assert time.monotonic() - started < 15
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert _unreachable_hub() is None  # (501 to HEAD: an answer)
    finally:
        server.shutdown()


def test_mismatched_line_counts_name_both_files(tmp_path):
    (tmp_path / "a.de").write_text("1\n2\n3\n")
    (tmp_path / "a.en").write_text("1\n2\n")
    with pytest.raises(MTError, match=r"a\.de has 3 lines but .*a\.en has 2"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "bad.de").write_bytes("gut\nschön\n".encode() + b"\xff\xfe kaputt\n")
    with pytest.raises(MTError, match=r"bad\.de:3: invalid UTF-8"):
        read_lines(tmp_path / "bad.de")


def test_empty_and_overlong_pairs_are_dropped_and_counted(tmp_path):
    src = ["a b", "", "c", "x " * 50, "d\x07e"]
    tgt = ["A B", "B", "   ", "X", "D E"]
    stats = Stats()
    s, t = drop_empty(src, tgt, stats)
    assert (stats.total, stats.empty) == (5, 2)
    assert s[-1] == "d e"  # control character removed
    tok = Tokenizer.train(
        s * 20,
        t * 20,
        vocab_size=40,
        joint=True,
        character_coverage=1.0,
        max_sentences=1000,
        seed=0,
    )
    data = encode_pairs(s, t, tok, max_len=10, stats=stats)
    assert stats.too_long == 1 and stats.kept == 2 and len(data.src) == 2
    assert "2 of 5 pairs kept (2 empty, 1 longer" in stats.describe("train")


def test_cli_reports_corpus_problem_without_traceback(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "train.src").write_text("a\nb\n")
    (d / "train.tgt").write_text("a\n")
    (d / "valid.src").write_text("a\n")
    (d / "valid.tgt").write_text("a\n")
    proc = run_mt(
        "train",
        "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "r",
        "--set",
        f"data.dir={d}",
        "data.dataset=null",
    )
    assert_user_error(proc, "train.src has 2 lines", "train.tgt has 1")


def test_batches_respect_max_tokens_and_cover_everything():
    rng = np.random.default_rng(0)
    src_lens, tgt_lens = rng.integers(1, 40, 500), rng.integers(1, 40, 500)
    batches = token_batches(src_lens, tgt_lens, max_tokens=300, seed=3)
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for b in batches:
        assert len(b) == 1 or len(b) * (src_lens[b].max() + tgt_lens[b].max()) <= 300
    again = token_batches(src_lens, tgt_lens, max_tokens=300, seed=3)
    assert all((a == b).all() for a, b in zip(batches, again, strict=True))


def test_batches_keep_both_sides_padding_low():
    """Caption-like lengths (target about the source's length, +-15%): sorting by source
    length alone left 13% of target positions as padding; both sides must stay under 5%."""
    from mt.data.batching import padding_fraction
    from mt.data.corpus import TokenArray

    rng = np.random.default_rng(0)
    src_lens = np.clip(rng.normal(14, 5, 20_000).round(), 3, 60).astype(int)
    tgt_lens = np.clip((src_lens * rng.normal(1.0, 0.15, 20_000)).round(), 3, 60).astype(int)
    batches = token_batches(src_lens + 1, tgt_lens + 1, max_tokens=8192, seed=0)
    for lens in (src_lens, tgt_lens):
        side = TokenArray([[5] * n for n in lens])
        assert padding_fraction(side, batches) < 0.05


def test_padding_fraction_counts_the_batch_tensors_positions():
    """Lengths 1 and 3 in one batch: the tensors hold (1+1) + (3+1) real of 2 x 4 positions."""
    from mt.data.batching import describe_batches, padding_fraction
    from mt.data.corpus import ParallelData, TokenArray

    data = ParallelData(TokenArray([[5], [6, 7, 8]]), TokenArray([[9, 9], [9, 9]]), Stats())
    batches = [np.array([0, 1])]
    assert padding_fraction(data.src, batches) == 0.25
    assert padding_fraction(data.tgt, batches) == 0.0
    b = collate(data, batches[0])
    assert float((b.src == PAD).float().mean()) == 0.25
    assert describe_batches(data, batches, 100) == (
        "batches: 1 per epoch of at most 100 tokens, in 1 shape; padding 25.0% of source, "
        "0.0% of target positions"
    )


def test_collate_teacher_forcing_shift():
    from mt.data.corpus import ParallelData, TokenArray

    data = ParallelData(TokenArray([[5, 6], [7]]), TokenArray([[8, 9, 10], [11]]), Stats())
    b = collate(data, np.array([0, 1]))
    assert b.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 8, 9, 10], [BOS, 11, PAD, PAD]]
    assert b.tgt_out.tolist() == [[8, 9, 10, EOS], [11, EOS, PAD, PAD]]
    assert b.n_tokens == 6


def test_train_without_data_tries_the_hub_then_says_how_to_import(tmp_path):
    proc = run_mt(
        "train",
        "configs/multi30k_de_en.yaml",
        "--run-dir",
        tmp_path / "r",
        "--set",
        f"data.dir={tmp_path / 'none'}",
    )
    assert_user_error(proc, "mt download multi30k --from-dir DIR --out")


def _snapshot(folder):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    ("langs", "needle"),
    [
        (["data.src_lang=de", "data.tgt_lang=en"], "no valid data"),  # val.* is not valid.*
        (["data.src_lang=dee", "data.tgt_lang=en"], "no train data"),  # a typo'd language
    ],
)
def test_mt_train_never_writes_into_a_users_corpus_folder(tmp_path, langs, needle):
    """tiny.yaml names the synthetic corpus, but data.dir holds the user's files: the missing
    split is an error naming what is there, and nothing is written into the folder."""
    corpus = tmp_path / "mine"
    corpus.mkdir()
    for name in ("train.de", "train.en", "val.de", "val.en"):
        (corpus / name).write_text("ein Satz\n" if name.endswith("de") else "a sentence\n")
    before = _snapshot(corpus)
    proc = run_mt(
        "train", "tiny", "--run-dir", tmp_path / "r", "--set", f"data.dir={corpus}", *langs
    )
    assert_user_error(proc, needle, "train.de, train.en, val.de, val.en", "data.src_lang")
    assert "--force" not in proc.stderr and "downloading" not in proc.stderr
    assert _snapshot(corpus) == before


def test_the_built_in_corpus_is_fetched_only_into_an_absent_empty_or_own_folder(tmp_path):
    from mt.config import load_config
    from mt.data.download import MARKER
    from mt.data.prepare import ensure_data

    def cfg(folder):
        return load_config("tiny", [f"data.dir={folder}"])

    said = []
    ensure_data(cfg(tmp_path / "absent"), said.append)
    assert (tmp_path / "absent/train.src").is_file() and said
    assert (tmp_path / "absent" / MARKER).read_text().strip() == "synthetic"
    (tmp_path / "empty").mkdir()
    ensure_data(cfg(tmp_path / "empty"), said.append)
    assert (tmp_path / "empty/valid.tgt").is_file()
    (tmp_path / "absent/valid.src").unlink()  # mt's own folder: fetched again
    ensure_data(cfg(tmp_path / "absent"), said.append)
    assert (tmp_path / "absent/valid.src").is_file()
    # a folder of other files (no marker) is the user's: refused, untouched
    (tmp_path / "user").mkdir()
    (tmp_path / "user/notes.txt").write_text("mine\n")
    with pytest.raises(MTError, match=r"no train data.*notes\.txt.*only into an absent or empty"):
        ensure_data(cfg(tmp_path / "user"), said.append)
    assert [p.name for p in (tmp_path / "user").iterdir()] == ["notes.txt"]
    # mt download into a folder of the user's files does not make it mt's
    (tmp_path / "user/train.src").write_text("x\n")
    download("synthetic", tmp_path / "user2", force=False)
    assert (tmp_path / "user2" / MARKER).is_file()
    (tmp_path / "user3").mkdir()
    (tmp_path / "user3/notes.txt").write_text("mine\n")
    download("synthetic", tmp_path / "user3", force=False)
    assert not (tmp_path / "user3" / MARKER).exists()


def test_the_text_reader_drops_a_bom_and_says_crlf_and_nul_once(tmp_path, capsys):
    from mt.data.corpus import TextNotes, decode_text, iter_lines

    TextNotes.said.clear()
    path = tmp_path / "t.en"
    path.write_bytes(b"\xef\xbb\xbfa house\r\nthe\x00 cat\r\nend\n")
    for _ in range(3):  # a corpus is read several times: said once
        assert list(iter_lines(path)) == ["a house", "the\x00 cat", "end"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert "t.en: 2 line(s) end in CRLF" in err[0]
    assert "t.en: NUL bytes on 1 line(s) (first: line 2)" in err[1]
    assert decode_text(b"\xef\xbb\xbfein Haus\nzwei\n", "stdin") == ["ein Haus", "zwei"]
    assert capsys.readouterr().err == ""
    plain = tmp_path / "p.en"
    plain.write_text("\ufeff is only dropped at the start\nx \ufeff\n", encoding="utf-8")
    assert read_lines(plain) == ["\ufeff is only dropped at the start"[1:], "x \ufeff"]


def test_a_bom_changes_no_command_s_result(tmp_path, tiny_run):
    """The same text with and without a byte-order mark: the same translations (file and
    stdin) and the same scores (hypothesis and reference); CRLF is said once, in one line."""
    from mt.data.corpus import read_lines

    src = read_lines(tiny_run.parent / "data/test.src")[:20]
    ref = read_lines(tiny_run.parent / "data/test.tgt")[:20]
    plain, bom = tmp_path / "plain", tmp_path / "bom"
    plain.mkdir()
    bom.mkdir()
    for name, lines in (("src", src), ("ref", ref)):
        (plain / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        (bom / name).write_bytes(b"\xef\xbb\xbf" + "".join(x + "\r\n" for x in lines).encode())
    outs = []
    for d in (plain, bom):
        t = run_mt("translate", tiny_run, "-i", d / "src", "--greedy")
        s = run_mt("translate", tiny_run, "--greedy", input=(d / "src").read_text("utf-8"))
        assert t.returncode == 0 and s.returncode == 0, t.stderr + s.stderr
        outs += [t.stdout, s.stdout]
        (d / "hyp").write_text(t.stdout, encoding="utf-8")
    assert len(set(outs)) == 1 and outs[0]
    (bom / "hyp").write_bytes(b"\xef\xbb\xbf" + outs[0].encode())
    scores = []
    for hyp, ref in ((plain, plain), (bom, plain), (plain, bom)):  # a mark on one side only
        e = run_mt("eval", "--hyp", hyp / "hyp", "--ref", ref / "ref", "--json")
        assert e.returncode == 0, e.stderr
        scores.append((json.loads(e.stdout)["bleu"], json.loads(e.stdout)["chrf"]))
        if ref == bom:
            assert e.stderr.count("end in CRLF") == 1 and "ref" in e.stderr, e.stderr
    assert scores[0] == scores[1] == scores[2]


def test_a_corpus_changed_before_a_resume_is_named(tmp_path):
    from mt.data.download import download as fetch

    fetch("synthetic", tmp_path / "d")
    args = [
        "train",
        "tiny",
        "--run-dir",
        tmp_path / "r",
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "train.valid_every=1000",
        "train.save_every=2",
        "train.average_last=0",
    ]
    assert run_mt(*args, "train.max_steps=2").returncode == 0
    train = tmp_path / "d/train.src"
    size = train.stat().st_size
    with open(train, "a", encoding="utf-8") as f:
        f.write("one more line\n")
    with open(tmp_path / "d/train.tgt", "a", encoding="utf-8") as f:
        f.write("one more line\n")
    before = (tmp_path / "r/last.pt").read_bytes()
    proc = run_mt(*args, "train.max_steps=4")
    assert_user_error(proc, "train.src", f"{size:,} bytes then", "--allow-config-change")
    assert len(proc.stderr.strip().splitlines()) == 1 + proc.stderr.count("using the built-in")
    assert (tmp_path / "r/last.pt").read_bytes() == before
    proc = run_mt(*args, "train.max_steps=4", "--allow-config-change")
    assert proc.returncode == 0 and "going on with the new files" in proc.stderr, proc.stderr
    proc = run_mt(*args, "train.max_steps=6")  # the new files are now the run's own
    assert proc.returncode == 0, proc.stderr


def _wmt_like_lengths(n: int, seed: int = 0):
    """Subword lengths shaped like WMT14 En-De's (mean about 29, a long tail, 1..128)."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.2, 0.55, n), 1, 127).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.05, 0.15, n), 1, 127).astype(np.int64)
    return src, tgt


def test_bucketed_batches_come_in_few_shapes_and_hold_every_sentence_once():
    from mt.data.batching import batch_shapes, bucket_batches

    src, tgt = _wmt_like_lengths(200_000)
    batches = bucket_batches(src + 1, tgt + 1, 8192, 16, seed=3)
    flat = np.concatenate(batches)
    assert np.array_equal(np.sort(flat[flat >= 0]), np.arange(len(src)))  # each once
    shapes = batch_shapes(src, tgt, batches, 16)
    widths = {(s, t) for _, s, t in shapes}
    assert len(shapes) == len(widths) <= 64  # one row count per width pair, 8 x 8 at most
    assert all(r * (s + t) <= 8192 or r == 1 for r, s, t in shapes)
    print(f"\nWMT-like, 200,000 pairs: {len(batches)} batches in {len(shapes)} shapes")
    # filler rows only in the last batch of a width pair: fewer than one batch per pair
    assert int((flat < 0).sum()) < sum(r for r, _, _ in shapes)
    again = bucket_batches(src + 1, tgt + 1, 8192, 16, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))


def test_bucketed_batches_give_the_same_loss_sum_and_tokens_as_padded_ones(tmp_path):
    """The same pairs, batched as today and in fixed shapes with empty filler rows: the summed
    loss and NLL and the token count agree (padding and empty rows count for nothing)."""
    from mt.data.batching import bucket_batches, collate, token_batches
    from mt.objectives.loss import reference_loss
    from tests.conftest import make_model

    rng = np.random.default_rng(0)
    n = 57
    src_l, tgt_l = rng.integers(1, 30, n), rng.integers(1, 30, n)
    import torch

    from mt.data.corpus import ParallelData, Stats, TokenArray

    data = ParallelData(
        TokenArray([list(rng.integers(4, 40, k)) for k in src_l]),
        TokenArray([list(rng.integers(4, 40, k)) for k in tgt_l]),
        Stats(),
    )
    model = make_model().eval()

    def totals(batches, multiple):
        loss = nll = 0.0
        tokens = 0
        shapes = set()
        with torch.no_grad():
            for b in batches:
                batch = collate(data, b, multiple=multiple)
                shapes.add(tuple(batch.src.shape) + tuple(batch.tgt_in.shape))
                lo, nl = reference_loss(model, batch, 0.1)
                loss, nll, tokens = loss + float(lo), nll + float(nl), tokens + batch.n_tokens
        return loss, nll, tokens, shapes

    plain = totals(token_batches(src_l + 1, tgt_l + 1, 300, seed=1), 0)
    bucketed = totals(bucket_batches(src_l + 1, tgt_l + 1, 300, 8, seed=1), 8)
    assert bucketed[2] == plain[2] == int((tgt_l + 1).sum())
    assert bucketed[0] == pytest.approx(plain[0], rel=1e-5)
    assert bucketed[1] == pytest.approx(plain[1], rel=1e-5)
    pairs = {
        (-(-(a + 1) // 8) * 8, -(-(b + 1) // 8) * 8) for a, b in zip(src_l, tgt_l, strict=True)
    }
    assert {(s, t) for _, s, _, t in bucketed[3]} == pairs  # one shape per width pair
    assert len(bucketed[3]) == len(pairs)


def test_training_on_bucketed_batches_says_its_shapes_and_resumes_exactly(tmp_path):
    def run(name, steps):
        return train_tiny(
            tmp_path / name,
            tmp_path / "d",
            f"train.max_steps={steps}",
            "train.log_every=2",
            "train.valid_every=100",
            "train.save_every=4",
            "train.average_last=0",
            "train.shape_buckets=16",
        )

    err, straight = run("straight", 8)
    import re

    n_shapes = int(re.search(r"in (\d+) shapes?; padding", err).group(1))
    assert 1 <= n_shapes <= 16, err  # widths up to 64 in steps of 16: at most 4 x 4
    run("resumed", 4)
    assert run("resumed", 8)[1] == straight


def test_collate_builds_what_a_sentence_by_sentence_loop_builds():
    """The gathers of collate against the obvious loop, on random lengths, with empty filler
    rows (-1) and widths rounded up to a multiple."""
    import torch

    from mt.data.batching import collate
    from mt.data.corpus import ParallelData, Stats, TokenArray
    from mt.tokens import BOS, EOS, PAD

    rng = np.random.default_rng(7)
    src = [list(rng.integers(4, 50, k)) for k in rng.integers(1, 20, 40)]
    tgt = [list(rng.integers(4, 50, k)) for k in rng.integers(1, 20, 40)]
    data = ParallelData(TokenArray(src), TokenArray(tgt), Stats())
    for indices, multiple in (([3, 0, 17, 39], 0), ([5, -1, 22, -1], 8), ([11], 16)):
        batch = collate(data, np.array(indices), multiple=multiple)
        real = [i for i in indices if i >= 0]
        s_w = max(len(src[i]) for i in real) + 1
        t_w = max(len(tgt[i]) for i in real) + 1
        if multiple:
            s_w, t_w = -(-s_w // multiple) * multiple, -(-t_w // multiple) * multiple
        for row, i in enumerate(indices):
            s = [] if i < 0 else src[i]
            t = None if i < 0 else tgt[i]
            want_src = s + [EOS] + [PAD] * (s_w - len(s) - 1)
            want_in = [BOS] + (t or []) + [PAD] * (t_w - 1 - len(t or []))
            want_out = [PAD] * t_w if t is None else t + [EOS] + [PAD] * (t_w - len(t) - 1)
            assert batch.src[row].tolist() == want_src
            assert batch.tgt_in[row].tolist() == want_in
            assert batch.tgt_out[row].tolist() == want_out
        assert batch.n_tokens == sum(len(tgt[i]) + 1 for i in real)
        assert batch.src.dtype == torch.int64


def _import(source, out, *flags):
    """mt download of a table corpus, in this process: (exit code, stderr)."""
    from tests.conftest import mt_here

    code, _, err = mt_here("download", "mine", "--from-dir", source, *flags, "--out", out)
    return code, err


def test_tables_import_with_their_columns_named_and_a_valid_split_drawn(tmp_path):
    """A TSV (no header: --src and --tgt name its columns) or a CSV (its header names them),
    as a folder of SPLIT tables or one table of training pairs; --valid-size draws a valid
    split from train, the same for the same corpus."""
    rows = [(f"a man {i}", f"ein mann {i}") for i in range(50)]
    (tmp_path / "t").mkdir()
    (tmp_path / "t/train.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in rows))
    (tmp_path / "t/test.tsv").write_text("hello\thallo\n")
    langs = ["--src", "en", "--tgt", "de"]
    code, err = _import(tmp_path / "t", tmp_path / "o", *langs, "--valid-size", "10")
    assert code == 0 and "10 pairs drawn from train" in err, err
    valid = (tmp_path / "o/valid.en").read_text().splitlines()
    train = (tmp_path / "o/train.en").read_text().splitlines()
    assert len(valid) == 10 and len(train) == 40 and not set(valid) & set(train)
    assert sorted(valid + train) == sorted(a for a, _ in rows)
    pairs = dict(zip(valid, (tmp_path / "o/valid.de").read_text().splitlines(), strict=True))
    assert all(pairs[a] == a.replace("a man", "ein mann") for a in valid)  # (rows kept whole)
    assert (tmp_path / "o/test.de").read_text() == "hallo\n"
    _import(tmp_path / "t", tmp_path / "again", *langs, "--valid-size", "10")
    assert (tmp_path / "again/valid.en").read_text().splitlines() == valid  # (the same draw)

    (tmp_path / "pairs.csv").write_text('id,de,en\n1,"Hund, klein",small dog\n2,Katze,cat\n')
    code, err = _import(tmp_path / "pairs.csv", tmp_path / "c", *langs)
    assert code == 0, err
    assert (tmp_path / "c/train.de").read_text() == "Hund, klein\nKatze\n"
    assert (tmp_path / "c/train.en").read_text() == "small dog\ncat\n"


@pytest.mark.parametrize(
    "table,flags,needle",
    [
        ("a\tb\n", [], "--src LANG and --tgt LANG"),
        ("a\tb\nc\n", ["--src", "en", "--tgt", "de"], "line 2: 1 column(s)"),
        ("x,y\n1,2\n", ["--src", "en", "--tgt", "de"], "its columns are x, y"),
    ],
)
def test_a_table_that_cannot_be_read_as_two_columns_is_one_line(tmp_path, table, flags, needle):
    name = "train.csv" if table.startswith("x,") else "train.tsv"
    (tmp_path / name).write_text(table)
    code, err = _import(tmp_path / name, tmp_path / "o", *flags)
    assert code == 2 and needle in err and not (tmp_path / "o").exists(), err


def test_each_filter_drops_and_counts_the_pairs_built_to_break_it(tmp_path):
    """A corpus of 10 good pairs with known bad ones among them: 2 empty, 1 too long, 3
    repeats of a good pair and 2 past a length ratio of 2 (subwords): each rule drops its
    own and says how many; with the filters off only the empty and the long go."""
    from mt.data.corpus import Stats
    from mt.data.pairs import Pair
    from mt.data.prepare import encode_train
    from mt.data.tokenizer import Tokenizer, train_bpe
    from tests.conftest import tiny_config

    good = [(f"a b c {w}", f"x y z {w}") for w in "defghijklm"]
    bad = [("", "x"), ("a", " "), (" ".join("abcdefghij" * 3), "x y"), good[0], good[0], good[1]]
    bad += [("a b c d e f g h", "x y"), ("a", "x y z d e f")]
    rows = good[:5] + bad + good[5:]
    (tmp_path / "train.src").write_text("".join(s + "\n" for s, _ in rows))
    (tmp_path / "train.tgt").write_text("".join(t + "\n" for _, t in rows))
    words = [w for s, t in rows for w in (s, t) if w.strip()]
    tok = Tokenizer(train_bpe(words * 20, vocab_size=40))
    on = tiny_config(
        tmp_path, "data.max_len=12", "data.max_len_ratio=2", "data.drop_duplicates=true"
    )
    stats = Stats()
    data = encode_train(on, tok, stats, 0.0, 0, Pair("src", "tgt"))
    assert (stats.total, stats.empty, stats.too_long, stats.duplicate, stats.ratio) == (
        18,
        2,
        1,
        3,
        2,
    )
    assert len(data.src) == stats.kept == 10
    said = "10 of 18 pairs kept (2 empty, 1 longer than max_len, 3 duplicates, 2 past the"
    assert said + " length ratio dropped)" in stats.describe("train")
    off = Stats()
    encode_train(tiny_config(tmp_path, "data.max_len=12"), tok, off, 0.0, 0, Pair("src", "tgt"))
    assert (off.kept, off.duplicate, off.ratio) == (15, 0, 0)
    with pytest.raises(MTError, match="max_len_ratio"):
        tiny_config(tmp_path, "data.max_len_ratio=0.5")


def test_corpora_are_drawn_by_their_weights(tmp_path):
    """data.corpora: a second corpus of the pair (train.bt.*) at weight 3 beside the main one
    (weight 1) makes an epoch of both corpora's length in which each of its pairs is drawn 3
    times as often as a main one; the start says each corpus's count; a corpus without its
    files, or with data.pairs, is one line."""
    from mt.data.download import download
    from mt.data.pairs import epoch_members
    from mt.data.walk import epoch_order
    from tests.conftest import trainer_for

    sizes = [100, 50]
    part_of = np.repeat(np.arange(2), sizes)
    drawn = epoch_members(part_of, 1.0, seed=1, weights=(1.0, 4.0))  # 100 : 4 x 50 of 150
    assert np.bincount(part_of[drawn]).tolist() == [50, 100]
    assert epoch_members(part_of, 1.0, seed=1, weights=(1.0, 1.0)) is None  # (the corpus)

    data = tmp_path / "d"
    download("synthetic", data)
    main = (data / "train.src").read_text().splitlines()
    for side in ("src", "tgt"):  # the first 400 pairs again, as another corpus
        lines = (data / f"train.{side}").read_text().splitlines()[:400]
        (data / f"train.bt.{side}").write_text("\n".join(lines) + "\n")
    trainer = trainer_for(tmp_path, "data.corpora=[{name: bt, weight: 3}]")
    try:
        train = trainer.train_data
        assert train.weights == (1.0, 3.0) and len(train.src) == len(main) + 400
        order = np.concatenate(epoch_order(train, trainer.cfg, 0))
        order = order[order >= 0]
        got = np.bincount(train.pair_of[order], minlength=2)
        n_main, n_bt = len(main), 400
        want = np.array([n_main, 3 * n_bt]) / (n_main + 3 * n_bt) * (n_main + n_bt)
        np.testing.assert_allclose(got, want, atol=2)
    finally:
        trainer.lock.release()
    (data / "train.bt.tgt").unlink()
    with pytest.raises(MTError, match=r"data\.corpora bt: .*train\.bt\.tgt not found"):
        trainer_for(tmp_path / "x", f"data.dir={data}", "data.corpora=[{name: bt}]")
    with pytest.raises(MTError, match=r"data\.corpora weighs the corpora of one pair"):
        trainer_for(tmp_path / "y", "data.pairs=[src-tgt,tgt-src]", "data.corpora=[{name: bt}]")


def test_a_tagged_corpus_leads_its_sources_with_bt_and_no_translation_holds_it(tmp_path):
    """data.corpora with `tagged`: the BPE model reserves <BT> whole, every source of that
    corpus starts with it and no other source holds it; a translation never contains it, even
    from a model that prefers it above every other token; user text holding it is refused in
    one line, as a target-language token is; a BPE model without the piece is refused."""
    import torch

    from mt.config import DecodeConfig
    from mt.data.batching import collate
    from mt.data.download import download
    from mt.data.tokenizer import HeldToken
    from mt.decode.translator import Translator
    from tests.conftest import trainer_for

    data = tmp_path / "d"
    download("synthetic", data)
    for side in ("src", "tgt"):
        lines = (data / f"train.{side}").read_text().splitlines()[:300]
        (data / f"train.bt.{side}").write_text("\n".join(lines) + "\n")
    trainer = trainer_for(tmp_path, "data.corpora=[{name: bt, tagged: true}]")
    try:
        tok, train = trainer.tokenizer, trainer.train_data
        bt = tok.never_written()
        assert bt is not None and tok.src_pieces_of([bt]) == ["<BT>"]
        tagged = [i for i in range(len(train.src)) if train.pair_of[i] == 1]
        real = [i for i in range(len(train.src)) if train.pair_of[i] == 0]
        assert len(tagged) == 300 and all(train.src[i][0] == bt for i in tagged)
        assert not any(bt in train.src[i] for i in real)
        batch = collate(train, np.array([real[0], tagged[0], tagged[1]]))
        assert batch.src[:, 0].tolist()[1:] == [bt, bt] and batch.src[0, 0] != bt

        model = trainer.model.eval()
        project = model.project

        def prefers_bt(h):
            logits = project(h)
            logits[..., bt] += 100.0
            return logits

        model.project = prefers_bt
        translator = Translator(model, tok, DecodeConfig(), torch.device("cpu"))
        for beam in (1, 4):
            found = translator.search(["a b c d", "e f"], beam=beam)
            assert all(bt not in ids for _, outs in found for ids, _ in outs), found
        assert "<BT>" not in " ".join(translator.translate(["a b c d"]))
        with pytest.raises(HeldToken, match="back-translated"):
            translator.translate(["<BT> a b c"])
    finally:
        trainer.lock.release()
    budget = ["train.max_steps=2", "train.valid_every=2", "train.save_every=2"]
    untagged = trainer_for(tmp_path / "y", f"data.dir={data}", *budget)
    untagged.fit()  # (a source run whose BPE model has no <BT>)
    untagged.close()
    from mt.train.build import build_trainer, load_run_config

    sets = [f"data.dir={data}", f"model.init_from={tmp_path / 'y' / 'run'}"]
    cfg = load_run_config(
        ROOT / "configs/tiny.yaml", [*sets, "data.corpora=[{name: bt, tagged: true}]"]
    )
    with pytest.raises(MTError, match=r"data\.corpora bt is tagged, but .* no <BT> piece"):
        build_trainer(cfg, tmp_path / "z", log=lambda *_: None)
