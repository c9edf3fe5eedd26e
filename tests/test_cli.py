import json
import pytest

from mt.data.corpus import read_lines
from mt.data.synthetic import generate
from mt.translator import Translator
from tests.conftest import ROOT, assert_user_error, run_mt


def test_help_for_every_command():
    for cmd in ("download", "train", "translate", "eval"):
        proc = run_mt(cmd, "--help")
        assert proc.returncode == 0 and "Example" in proc.stdout, proc.stdout


def test_translate_keeps_line_count_and_order(tiny_run, tmp_path):
    src, _ = generate(30, seed=99)
    lines = src[:10] + [""] + src[10:20] + ["   "] + src[20:] + [""]
    (tmp_path / "in.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_mt("translate", tiny_run, "-i", tmp_path / "in.src", "-o", tmp_path / "out",
                  "--beam", "3")
    assert proc.returncode == 0, proc.stderr
    out = read_lines(tmp_path / "out")
    assert len(out) == len(lines)
    assert [i for i, o in enumerate(out) if not o] == [10, 21, 32]
    # order restored after length sorting: each line translated alone gives the same output
    tr = Translator.from_checkpoint(tiny_run, "cpu")
    alone = [tr.translate([line], beam=3)[0] for line in lines]
    assert out == alone
    # stdin -> stdout, greedy
    proc = run_mt("translate", tiny_run / "last.pt", "--greedy", input="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == tr.translate(lines, beam=1)


def test_eval_scores_hyp_file_and_model(tiny_run, tmp_path):
    ref = tmp_path / "ref"
    ref.write_text("the cat sat on the mat\na dog\n")
    proc = run_mt("eval", "--hyp", ref, "--ref", ref, "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["bleu"] == 100.0 and res["chrf"] == 100.0 and "nrefs:1" in res["signature"]
    proc = run_mt("eval", "--hyp", ref, "--ref", ref)
    assert "BLEU = 100.00" in proc.stdout and "version:" in proc.stdout
    short = tmp_path / "short"
    short.write_text("one line\n")
    assert_user_error(run_mt("eval", "--hyp", short, "--ref", ref), "same number of lines")
    assert_user_error(run_mt("eval", "--ref", ref), "nothing to score")


def test_bad_flags_exit_2(tiny_run, tmp_path):
    assert run_mt("translate", tiny_run, "--beam", "0", input="a\n").returncode == 2
    assert_user_error(run_mt("translate", tiny_run, "--device", "tpu", input="a\n"), "--device")
    assert_user_error(run_mt("translate", tiny_run, "-i", tmp_path / "nope"), "not found")
    assert_user_error(run_mt("translate", tmp_path), "no best.pt or last.pt")


def test_rerun_refuses_a_different_config(tiny_run):
    before = (tiny_run / "last.pt").read_bytes()
    data_dir = tiny_run.parent / "data"
    assert_user_error(run_mt("train", ROOT / "configs/tiny.yaml", "--run-dir", tiny_run,
                             "--set", f"data.dir={data_dir}", "model.d_model=32"),
                      "different config", "model.d_model: 64 -> 32")
    assert (tiny_run / "last.pt").read_bytes() == before


def test_lowercased_tokenized_bleu_ignores_case_and_tokenization(tmp_path):
    from mt.metrics import lc_tok_bleu, moses_lc_tokenize
    assert moses_lc_tokenize(['A man\'s "hat", isn\'t it?'], "en") == \
        ["a man &apos;s &quot; hat , &quot; isn &apos;t it ?"]
    refs = ["A dog runs, in the snow.", "Two men play football."]
    hyps = ["a dog runs , in the snow .", "two men play football ."]
    assert lc_tok_bleu(hyps, refs, "en") == pytest.approx(100.0)
    (tmp_path / "h").write_text("\n".join(hyps) + "\n")
    (tmp_path / "r").write_text("\n".join(refs) + "\n")
    proc = run_mt("eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "r", "--lc-tok", "en", "--json")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["bleu_lc_tok"] == 100.0 and res["bleu"] < 100.0
