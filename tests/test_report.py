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
