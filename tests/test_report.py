"""`mt report`: one self-contained HTML page with every section, which a browser renders."""

import shutil
import subprocess

import pytest

from tests.conftest import ROOT, assert_user_error, run_mt


def test_report_has_every_section_and_renders(tiny_run, tmp_path):
    page = tmp_path / "report.html"
    proc = run_mt("report", tiny_run, "--baseline", tiny_run, "-o", page)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    for section in (
        "Training curves",
        "Validation",
        "Decoding tuned on the valid split",
        "Test scores",
        "Attention",
        "The 5 best by sentence BLEU",
        "The 5 worst by sentence BLEU",
        "Against the baseline",
        "Config",
    ):
        assert f">{section}<" in text, section
    assert text.count("data:image/png;base64,") >= 3  # curves and attention, embedded
    assert "nrefs:1|bs:1000" in text and "tok:13a" in text  # scores with their signature
    assert 'src="http' not in text and 'href="http' not in text  # nothing to fetch
    assert_user_error(run_mt("report", tiny_run, "-o", page), "already exists")
    if shutil.which("chromium") is None:
        pytest.skip("no chromium to render the page (apt-get install chromium)")
    png = tmp_path / "report.png"
    proc = subprocess.run(
        ["bash", ROOT / "scripts/render_report.sh", page, png],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000


def _tables(page: str) -> list[list[list[str]]]:
    """Every <table> of the page as rows of cell texts (header row first)."""
    from html.parser import HTMLParser

    tables: list[list[list[str]]] = []

    class Cells(HTMLParser):
        in_cell = False

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                tables.append([])
            elif tag == "tr":
                tables[-1].append([])
            elif tag in ("td", "th"):
                tables[-1][-1].append("")
                self.in_cell = True

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.in_cell = False

        def handle_data(self, data):
            if self.in_cell:
                tables[-1][-1][-1] += data

    Cells().feed(page)
    return tables


def test_the_reports_numbers_are_mt_evals(tiny_run, tmp_path):
    """The test scores and the comparison with a baseline, read back from the page, equal
    `mt eval`'s on the same model, files and baseline (p-values with 4 decimals)."""
    import json

    data = tiny_run.parent / "data"
    baseline = tiny_run / "step_30.pt"
    page = tmp_path / "r.html"
    proc = run_mt("report", tiny_run, "--baseline", baseline, "-o", page)
    assert proc.returncode == 0, proc.stderr
    tables = _tables(page.read_text())
    scores = next(t for t in tables if t[0][:2] == ["metric", "score"])
    one = run_mt("eval", tiny_run, "--src", data / "test.src", "--ref", data / "test.tgt", "--json")
    assert one.returncode == 0, one.stderr
    expected = json.loads(one.stdout)
    got = {row[0]: row[1] for row in scores[1:]}
    for key, name in (("bleu", "BLEU"), ("chrf", "chrF"), ("chrf_pp", "chrF++"), ("ter", "TER")):
        assert got[name] == f"{expected[key]:.2f}", name
    paired = next(t for t in tables if t[0][0] == "system")
    both = run_mt(
        "eval", baseline, tiny_run, "--src", data / "test.src", "--ref", data / "test.tgt",
        "--json",
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    rows = json.loads(both.stdout)["systems"]
    header = paired[0]
    assert "BLEU p (bootstrap)" in header and "chrF p (AR)" in header
    base_row, this_row = (dict(zip(header, r, strict=True)) for r in paired[1:])
    assert base_row["BLEU p (bootstrap)"] == "baseline"
    for metric, name in (("bleu", "BLEU"), ("chrf", "chrF")):
        assert base_row[name] == f"{rows[0][metric]:.2f}"
        assert this_row[name] == f"{rows[1][metric]:.2f}"
        assert this_row[f"{name} p (bootstrap)"] == f"{rows[1][metric + '_p_bs']:.4f}"
        assert this_row[f"{name} p (AR)"] == f"{rows[1][metric + '_p_ar']:.4f}"


def test_report_scores_several_references_together(tiny_run, tmp_path):
    """`mt report --ref A --ref B`: the test scores are multi-reference (nrefs:2, the BLEU
    sacreBLEU gives for both), not the last file's alone; references of other lengths are
    one line."""
    import re

    import sacrebleu

    from mt.decode.translator import Translator
    from tests.conftest import mt_here

    lines = (tiny_run.parent / "data" / "test.src").read_text().splitlines()[:20]
    (tmp_path / "src").write_text("\n".join(lines) + "\n")
    hyps = Translator.load(tiny_run / "best.pt", "cpu").translate(lines)
    a = [h if i % 2 else "x y z" for i, h in enumerate(hyps)]  # half right by each reference
    b = [h if not i % 2 else "x y z" for i, h in enumerate(hyps)]
    for name, refs in (("a", a), ("b", b), ("short", a[:5])):
        (tmp_path / name).write_text("\n".join(refs) + "\n")
    page = tmp_path / "report.html"
    refs = ["--ref", tmp_path / "a", "--ref", tmp_path / "b"]
    code, _, err = mt_here("report", tiny_run, "--src", tmp_path / "src", *refs, "-o", page)
    assert code == 0, err
    text = page.read_text()
    assert "nrefs:2" in text
    both = sacrebleu.corpus_bleu(hyps, [a, b]).score
    assert both > sacrebleu.corpus_bleu(hyps, [b]).score + 10
    assert re.search(rf"BLEU</td><td>{both:.2f}|BLEU.{{0,80}}{both:.2f}", text), both
    refs[-1] = tmp_path / "short"
    code, _, err = mt_here("report", tiny_run, "--src", tmp_path / "src", *refs, "-o",
                           tmp_path / "r2.html")  # fmt: skip
    assert code == 2 and "several references must translate the same lines" in err, err
