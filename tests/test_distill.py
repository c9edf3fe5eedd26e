"""`mt distill`: the teacher's translations become the training targets; nothing else moves."""

from mt.decode.translator import Translator
from tests.conftest import assert_user_error, run_mt


def test_distilled_corpus_holds_the_teachers_translations(tiny_run, tmp_path):
    data, out = tmp_path / "data", tmp_path / "kd"
    data.mkdir()
    source = tiny_run.parent / "data"
    for split, n in (("train", 40), ("valid", 10), ("test", 10)):
        for lang in ("src", "tgt"):
            lines = (source / f"{split}.{lang}").read_text().splitlines()[:n]
            (data / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    proc = run_mt("distill", tiny_run, "--data", data, "--out", out, "--beam", "2")
    assert proc.returncode == 0, proc.stderr
    sources = (data / "train.src").read_text().splitlines()
    assert (out / "train.src").read_text().splitlines() == sources
    teacher = Translator.load(tiny_run, "cpu").translate(sources, beam=2)
    assert (out / "train.tgt").read_text().splitlines() == teacher
    assert teacher != (data / "train.tgt").read_text().splitlines()
    for name in ("valid.src", "valid.tgt", "test.src", "test.tgt"):  # references kept
        assert (out / name).read_bytes() == (data / name).read_bytes()
    before = (out / "train.tgt").read_bytes()
    assert_user_error(run_mt("distill", tiny_run, "--data", data, "--out", out), "already exists")
    assert (out / "train.tgt").read_bytes() == before
    assert_user_error(
        run_mt("distill", tiny_run, "--data", data, "--out", data, "--force"), "another folder"
    )
    assert_user_error(
        run_mt("distill", tiny_run, "--data", tmp_path, "--out", tmp_path / "x"), "no train.src"
    )
