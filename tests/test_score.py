"""mt score: a translation's likelihood by teacher forcing, the number beam search gives the
same hypothesis (its log-probability over (tokens + 1) ** length_penalty)."""

import json

import pytest

from mt.decode.scoring import score_pairs
from mt.decode.translator import Translator
from tests.conftest import mt_here


def _round_trips(translator, ids):
    """A hypothesis whose text reads back as the same subwords (else teacher forcing reads
    another segmentation than the search wrote)."""
    tok = translator.tokenizer
    return tok.encode_tgt(tok.decode_tgt([ids]))[0] == ids


@pytest.mark.parametrize("ensemble", [False, True])
def test_a_hypothesis_scores_what_the_beam_gave_it(tiny_run, ensemble):
    models = [tiny_run, tiny_run / "step_30.pt"] if ensemble else [tiny_run]
    translator = Translator.load(models, "cpu")
    lines = (tiny_run.parent / "data/test.src").read_text().splitlines()[:40]
    found = translator.search(lines, beam=4, nbest=3, length_penalty=1.3)
    sources, hyps, beam_scores = [], [], []
    for line, (src_ids, hyp) in zip(lines, found, strict=True):
        limit = int(1.5 * len(src_ids) + 5)  # (tiny.yaml's max_len_a and _b: a cut one is left out)
        for ids, score in hyp:
            if len(ids) < limit and _round_trips(translator, ids):
                sources.append(line)
                hyps.append(translator.tokenizer.decode_tgt([ids])[0])
                beam_scores.append(score)
    assert len(sources) > 60
    scored = score_pairs(translator, sources, hyps)
    for s, want in zip(scored, beam_scores, strict=True):
        assert abs(s.normalised(1.3) - want) < 1e-4, (s, want)


def test_mt_score_reads_two_files_or_tab_pairs_and_writes_a_line_each(tiny_run, tmp_path):
    src = tiny_run.parent / "data/test.src"
    sources = src.read_text().splitlines()[:5]
    hyps = tmp_path / "hyp.tgt"
    code, out, err = mt_here("translate", tiny_run, "-i", src, "--device", "cpu")
    hyps.write_text("".join(x + "\n" for x in out.splitlines()[:5]))
    (tmp_path / "src").write_text("".join(x + "\n" for x in sources))
    code, out, err = mt_here(
        "score", tiny_run, "--src", tmp_path / "src", "--tgt", hyps, "--device", "cpu"
    )
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) == 5 and all(len(r) == 4 for r in rows)
    pairs = "".join(
        f"{a}\t{b}\n" for a, b in zip(sources, hyps.read_text().splitlines(), strict=True)
    )
    code, again, err = mt_here("score", tiny_run, "--json", "--device", "cpu", input=pairs)
    assert code == 0, err
    for row, line in zip(rows, again.splitlines(), strict=True):
        got = json.loads(line)
        assert f"{got['score']:.6g}" == row[0] and got["tokens"] == int(row[2])
    code, _, err = mt_here("score", tiny_run, "--device", "cpu", input="a b\n")
    assert code == 2 and "line 1" in err and "SOURCE TAB TRANSLATION" in err, err
    (tmp_path / "short").write_text("a\n")
    code, _, err = mt_here(
        "score", tiny_run, "--src", tmp_path / "src", "--tgt", tmp_path / "short"
    )
    assert code == 2 and "5 lines but --tgt 1" in err, err
