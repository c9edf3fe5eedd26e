import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mt.data.corpus import read_lines
from mt.data.synthetic import generate
from mt.decode.translator import Translator
from tests.conftest import ROOT, assert_user_error, cli_env, mt_here, run_mt


def test_help_for_every_command():
    for cmd in (
        "download",
        "configs",
        "train",
        "translate",
        "eval",
        "attention",
        "export",
        "report",
        "average",
        "tune",
        "plot",
        "pretrain",
        "distill",
    ):
        proc = run_mt(cmd, "--help")
        assert proc.returncode == 0 and "Example" in proc.stdout, proc.stdout
        # values as plain words (FILE, N, MODEL...), not Typer's {braces} and <type labels>
        usage = proc.stdout.splitlines()[0]
        assert "{" not in usage and "<" not in proc.stdout.split("Options:")[0], proc.stdout
        for label in ("<path>", "<int", "<float", "<str>", "<list[", "list[Path]"):
            assert label not in proc.stdout, (cmd, label, proc.stdout)


def test_translate_keeps_line_count_and_order(tiny_run, tmp_path):
    src, _ = generate(30, seed=99)
    lines = [*src[:10], "", *src[10:20], "   ", *src[20:], ""]
    (tmp_path / "in.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_mt(
        "translate", tiny_run, "-i", tmp_path / "in.src", "-o", tmp_path / "out", "--beam", "3"
    )
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
    assert res["bleu"] == 100.0 and res["chrf"] == 100.0 and "nrefs:1" in res["bleu_signature"]
    assert res["chrf_pp"] == 100.0 and res["ter"] == 0.0 and "nw:2" in res["chrf_pp_signature"]
    proc = run_mt("eval", "--hyp", ref, "--ref", ref)
    assert "BLEU = 100.00" in proc.stdout and "version:" in proc.stdout
    assert "is a reference line for line" in proc.stderr  # (a score that says nothing)
    short = tmp_path / "short"
    short.write_text("one line\n")
    assert_user_error(run_mt("eval", "--hyp", short, "--ref", ref), "same number of lines")
    assert_user_error(run_mt("eval", "--ref", ref), "nothing to score")
    # a model: mt eval RUN_DIR translates --src with the run's tuned settings and scores it as
    # translating and scoring the file does
    src, tgt = generate(40, seed=5)
    (tmp_path / "s").write_text("\n".join(src) + "\n")
    (tmp_path / "t").write_text("\n".join(tgt) + "\n")
    by_model = run_mt("eval", tiny_run, "--src", tmp_path / "s", "--ref", tmp_path / "t", "--json")
    assert by_model.returncode == 0, by_model.stderr
    assert run_mt("translate", tiny_run, "-i", tmp_path / "s", "-o", tmp_path / "h").returncode == 0
    by_file = run_mt("eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "t", "--json")
    model_scores = json.loads(by_model.stdout.strip().splitlines()[-1])
    assert model_scores == json.loads(by_file.stdout.strip().splitlines()[-1])
    assert 0 < model_scores["bleu"] < 100
    assert "reference line for line" not in by_file.stderr


def test_eval_reads_standard_input_and_reports_the_metrics_chosen(tmp_path):
    """--hyp - scores what a pipe gives (mt translate ... | mt eval --hyp - ...), as the file
    scores; --metrics reports those chosen only, and a name it lacks is one line."""
    (tmp_path / "r").write_text("the cat sat on the mat\na dog runs\n")
    (tmp_path / "h").write_text("the cat sat on a mat\na dog ran\n")
    flags = ["--ref", tmp_path / "r", "--json"]
    code, by_file, err = mt_here("eval", "--hyp", tmp_path / "h", *flags)
    assert code == 0, err
    code, piped, err = mt_here("eval", "--hyp", "-", *flags, input=(tmp_path / "h").read_text())
    assert code == 0 and piped == by_file, err
    code, out, err = mt_here("eval", "--hyp", tmp_path / "h", *flags, "--metrics", "ter,BLEU")
    assert code == 0, err
    chosen = json.loads(out)
    assert chosen["bleu"] == json.loads(by_file)["bleu"] and "ter" in chosen
    assert "chrf" not in chosen and "chrf_pp" not in chosen, chosen
    code, out, _ = mt_here(
        "eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "r", "--metrics", "chrf++"
    )
    assert out.startswith("chrF++ = ") and "BLEU" not in out, out
    code, _, err = mt_here("eval", "--hyp", tmp_path / "h", *flags, "--metrics", "bleu,meteor")
    assert code == 2 and "--metrics 'bleu,meteor': choose among bleu, chrf, chrf++, ter" in err
    code, _, err = mt_here("eval", "--hyp", "-", "--hyp", "-", *flags, input="a\nb\n")
    assert code == 2 and "give it once" in err, err


def test_bad_flags_exit_2(tiny_run, tmp_path):
    assert run_mt("translate", tiny_run, "--beam", "0", input="a\n").returncode == 2
    assert_user_error(run_mt("translate", tiny_run, "--device", "tpu", input="a\n"), "--device")
    assert_user_error(run_mt("translate", tiny_run, "-i", tmp_path / "nope"), "not found")
    assert_user_error(run_mt("translate", tmp_path), "no best.pt or last.pt")
    # a bilingual model asked for another language: one line, in-process (mt_here)
    code, _, err = mt_here("translate", tiny_run, "--tgt-lang", "fr", input="a\n")
    assert code == 2 and "translates src-tgt only (a bilingual model)" in err, err
    code, _, err = mt_here("translate", tiny_run, "--tgt-lang", "tgt", "-o", tmp_path / "h",
                           input="a\n")  # fmt: skip
    assert code == 0, err
    code, _, err = mt_here("translate", tiny_run, "--greedy", "--beam", "5", input="a\n")
    assert code == 2 and "--greedy is --beam 1, and --beam 5 was given too" in err, err
    code, _, err = mt_here("translate", tiny_run, "--greedy", "--beam", "1", input="a\n")
    assert code == 0, err


def test_rerun_refuses_a_different_config(tiny_run):
    before = (tiny_run / "last.pt").read_bytes()
    data_dir = tiny_run.parent / "data"
    assert_user_error(
        run_mt(
            "train",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            tiny_run,
            "--set",
            f"data.dir={data_dir}",
            "model.d_model=32",
        ),
        "cannot change",
        "model.d_model: 64 -> 32",
    )
    assert (tiny_run / "last.pt").read_bytes() == before


def test_lowercased_tokenized_bleu_ignores_case_and_tokenization(tmp_path):
    from mt.evaluate.metrics import lc_tok_bleu, moses_lc_tokenize

    assert moses_lc_tokenize(["A man's \"hat\", isn't it?"], "en") == [
        "a man &apos;s &quot; hat , &quot; isn &apos;t it ?"
    ]
    refs = ["A dog runs, in the snow.", "Two men play football."]
    hyps = ["a dog runs , in the snow .", "two men play football ."]
    assert lc_tok_bleu(hyps, refs, "en") == pytest.approx(100.0)
    (tmp_path / "h").write_text("\n".join(hyps) + "\n")
    (tmp_path / "r").write_text("\n".join(refs) + "\n")
    proc = run_mt(
        "eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "r", "--lc-tok", "en", "--json"
    )
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["bleu_lc_tok"] == 100.0 and res["bleu"] < 100.0


def test_alignment_and_attention_picture(tiny_run, tmp_path):
    from mt.decode.alignment import cross_attention, hard_alignment

    tr = Translator.from_checkpoint(tiny_run, "cpu")
    lines = ["lo ka mi", "", "tu re"]
    proc = run_mt("translate", tiny_run, "--print-alignment", input="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")[:-1]
    assert len(out) == 3 and out[1] == "\t"
    assert [o.split("\t")[0] for o in out] == tr.translate(lines)
    src_ids, found = tr.search(["lo ka mi"])[0]
    hyp = found[0][0]  # the best hypothesis
    w = cross_attention(tr.model, src_ids, hyp, tr.device)
    assert w.shape[2:] == (len(hyp) + 1, len(src_ids) + 1)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)  # rows are distributions
    pairs = hard_alignment(w)
    assert len(pairs) == len(hyp) and all(0 <= s < len(src_ids) for s, _ in pairs)
    assert out[0].split("\t")[1] == " ".join(f"{s}-{t}" for s, t in pairs)
    proc = run_mt("attention", tiny_run, "lo ka mi", "-o", tmp_path / "a.png", "--grid")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert_user_error(
        run_mt("attention", tiny_run, "lo", "--layer", "9", "-o", tmp_path / "b.png"), "--layer 9"
    )


def test_eval_reports_chrf_pp_ter_and_bootstrap_intervals_as_sacrebleu_does(tmp_path):
    import sacrebleu

    _src, ref = generate(60, seed=11)
    hyp = [" ".join(line.split()[:-1]) or line for line in ref]  # drop each last word
    (tmp_path / "h").write_text("\n".join(hyp) + "\n")
    (tmp_path / "r").write_text("\n".join(ref) + "\n")
    proc = run_mt("eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "r", "--ci", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["chrf_pp"] == round(sacrebleu.CHRF(word_order=2).corpus_score(hyp, [ref]).score, 2)
    assert res["ter"] == round(sacrebleu.TER().corpus_score(hyp, [ref]).score, 2)
    for m in ("bleu", "chrf", "chrf_pp", "ter"):
        assert res[f"{m}_ci"] > 0 and abs(res[f"{m}_mean"] - res[m]) < 3 * res[f"{m}_ci"]
    text = run_mt("eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "r").stdout
    assert "chrF++ = " in text and "TER = " in text and "bootstrap" not in text


def test_eval_compares_systems_with_paired_tests(tmp_path):
    """The first system is the baseline; a clearly better system gets small p-values from
    both tests; a copy of the baseline gets p = 1."""
    _, ref = generate(80, seed=12)
    worse = [" ".join(line.split()[:-2]) or line for line in ref]
    better = [" ".join(line.split()[:-1]) or line for line in ref]
    for name, lines in (("r", ref), ("worse", worse), ("copy", worse), ("better", better)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    proc = run_mt(
        "eval",
        "--hyp",
        tmp_path / "worse",
        "--hyp",
        tmp_path / "copy",
        "--hyp",
        tmp_path / "better",
        "--ref",
        tmp_path / "r",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["systems"]
    assert [r["system"].rsplit("/", 1)[-1] for r in rows] == ["worse", "copy", "better"]
    assert rows[0]["bleu_p_bs"] is None  # the baseline
    assert rows[1]["bleu"] == rows[0]["bleu"] and rows[1]["same_as_baseline"]
    assert rows[1]["bleu_p_ar"] == rows[1]["bleu_p_bs"] == rows[1]["chrf_p_bs"] == 1.0
    assert rows[2]["bleu"] > rows[0]["bleu"]
    assert rows[2]["bleu_p_bs"] < 0.01 and rows[2]["bleu_p_ar"] < 0.01
    assert rows[2]["chrf_p_bs"] < 0.01 and rows[2]["chrf_p_ar"] < 0.01
    table = run_mt(
        "eval", "--hyp", tmp_path / "worse", "--hyp", tmp_path / "better", "--ref", tmp_path / "r"
    ).stdout
    assert "baseline" in table and "p (ar)" in table
    (tmp_path / "short").write_text("one line\n")
    assert_user_error(
        run_mt(
            "eval",
            "--hyp",
            tmp_path / "worse",
            "--hyp",
            tmp_path / "short",
            "--ref",
            tmp_path / "r",
        ),
        "short",
        "lines",
    )


def test_unknown_lc_tok_language_and_huge_beam_are_refused(tiny_run, tmp_path):
    ref = tmp_path / "ref"
    ref.write_text("a b\n")
    assert_user_error(
        run_mt("eval", "--hyp", ref, "--ref", ref, "--lc-tok", "klingon"),
        "--lc-tok 'klingon'",
        "en",
    )
    assert_user_error(
        run_mt("translate", tiny_run, "--beam", "10000", input="mi\n"), "--beam 10000", "at most"
    )
    assert_user_error(run_mt("tune", tiny_run, "--beams", "1,5000"), "--beam 5000")


def test_translate_at_a_terminal_answers_each_line(tiny_run):
    import pty

    leader, follower = pty.openpty()
    env = cli_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mt", "translate", str(tiny_run), "--greedy"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    )
    os.close(follower)
    os.write(leader, b"mi lo\nka tu\n\x04")
    out, err = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, err
    assert "Ctrl-D" in err and "greedy search" in err
    assert len(out.splitlines()) == 2


def test_version_and_builtin_configs_from_any_folder(tmp_path):
    proc = run_mt("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("mt ")
    proc = run_mt("configs", cwd=tmp_path)
    assert proc.returncode == 0 and "tiny" in proc.stdout and "multi30k_de_en" in proc.stdout
    proc = run_mt(
        "train", "tiny", "--set", "train.max_steps=3", "train.valid_every=3", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "using the built-in config tiny" in proc.stderr
    assert (tmp_path / "runs" / "tiny" / "last.pt").is_file()
    proc = run_mt("train", "configs/tiny.yaml", "--set", "train.max_steps=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # the README's path, anywhere
    assert "configs/tiny.yaml is not in" in proc.stderr and "built-in config tiny" in proc.stderr
    assert_user_error(run_mt("train", "nonesuch", cwd=tmp_path), "nonesuch", "mt configs")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MT_THREADS", "abc"),
        ("MT_THREADS", "-1"),
        ("WORLD_SIZE", "two"),
        ("WORLD_SIZE", "0"),
        ("RANK", "x"),
        ("LOCAL_RANK", "1.5"),
        ("LOCAL_WORLD_SIZE", "many"),
    ],
)
def test_a_bad_environment_variable_is_one_line_for_every_command(
    tmp_path, tiny_run, variable, value
):
    src = tmp_path / "s"
    src.write_text("a b\n")
    commands = [
        ("train", "tiny", "--run-dir", tmp_path / "r"),
        ("translate", tiny_run, "-i", src, "-o", tmp_path / "out"),
        ("eval", "--hyp", src, "--ref", src),
    ]
    if variable == "WORLD_SIZE":
        commands.append(("pretrain", "tiny", "--run-dir", tmp_path / "p"))
    for args in commands:
        proc = _run_with_env(args, {variable: value})
        assert_user_error(proc, f"{variable}={value!r}", "whole number")
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "out").exists()


def _run_with_env(args, extra: dict, stdout=subprocess.PIPE):
    env = dict(cli_env(), **extra)
    return subprocess.run(
        [sys.executable, "-m", "mt", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this machine")
def test_standard_output_on_a_full_disk_is_one_line_for_every_command(tmp_path, tiny_run):
    """Text that cannot be written to standard output (here /dev/full, which answers every
    write with ENOSPC; opened for writing only, never replaced) is one line and exit 2."""
    src = tmp_path / "s"
    src.write_text("a b\nc d\n")
    commands = [
        ("--version",),
        ("translate", "--help"),
        ("configs",),
        ("translate", tiny_run, "-i", src),
        ("translate", tiny_run, "-i", src, "-o", "-"),
        ("translate", tiny_run, "-i", src, "--nbest", "2"),
        ("eval", "--hyp", src, "--ref", src),
        ("eval", "--hyp", src, "--hyp", src, "--ref", src, "--json"),
        ("eval", tiny_run, "--src", src, "--ref", src),
        ("plot", tiny_run, "-o", tmp_path / "p.png"),
    ]
    for args in commands:
        with open("/dev/full", "w") as full:
            proc = _run_with_env(args, {}, stdout=full)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("error: standard output: No space")


def test_a_reader_that_stops_reading_ends_mt_quietly(tiny_run, tmp_path):
    """`mt translate ... | head -1`: the closed pipe ends mt like SIGPIPE would, silently."""
    src = tmp_path / "s"
    src.write_text("a b\n" * 20000)  # more output than a pipe holds
    proc = subprocess.run(
        f"{sys.executable} -m mt translate {tiny_run} -i {src} --greedy | head -1; "
        f"echo status ${{PIPESTATUS[0]}} >&2",
        shell=True,
        executable="/bin/bash",
        cwd=ROOT,
        env=dict(cli_env(), PYTHONUNBUFFERED="0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert len(proc.stdout.splitlines()) == 1
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert "error" not in proc.stderr and "status 141" in proc.stderr, proc.stderr


def test_first_hour_mistakes_with_models_and_inputs_are_one_clear_line(tmp_path, tiny_run):
    import torch

    src = tmp_path / "s"
    src.write_text("a b\n")
    out = tmp_path / "out"
    cases = [
        (("translate", tiny_run, "-i", tmp_path, "-o", out), ["is a folder", "-i FILE"]),
        (("eval", "--hyp", tmp_path, "--ref", src), ["is a folder", "text file"]),
        (("eval", "--hyp", src, "--ref", tmp_path), ["is a folder"]),
        (("translate", ROOT / "configs/tiny.yaml", "-i", src), ["not a checkpoint", "text file"]),
    ]
    torch.save({"not": "mt"}, tmp_path / "other.pt")
    torch.save({"a": object}, tmp_path / "objects.pt")
    (tmp_path / "cut.pt").write_bytes((tiny_run / "last.pt").read_bytes()[:100])
    cases += [
        (("translate", tmp_path / "other.pt", "-i", src), ["not an mt checkpoint of format"]),
        (("translate", tmp_path / "objects.pt", "-i", src), ["holds Python objects"]),
        (("translate", tmp_path / "cut.pt", "-i", src), ["corrupt", "central directory)"]),
    ]
    if not torch.cuda.is_available():
        flag = ["--device is cuda", "use --device auto or cpu"]
        cases += [
            (("translate", tiny_run, "--device", "cuda", "-i", src, "-o", out), flag),
            (("eval", tiny_run, "--src", src, "--ref", src, "--device", "cuda"), flag),
        ]
    cases.append(  # mask-predict's knobs on a model that searches
        (("translate", tiny_run, "-i", src, "--nat-iterations", "4"), ["apply to model.arch nat"])
    )
    for args, needles in cases:
        proc = run_mt(*args)
        assert_user_error(proc, *needles)
        assert "train.device" not in proc.stderr and "If you are seeing" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
        assert not out.exists()


def test_ctrl_c_during_translate_exits_130_with_a_line_and_no_output(tmp_path, tiny_run):
    import signal
    import time

    src = tmp_path / "s"
    # (far more than 8 s of work even where the shared tiny model ends every line at once)
    src.write_text("a b c d e f g h\n" * 200000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mt", "translate", str(tiny_run), "-i", str(src), "-o",
         str(tmp_path / "out"), "--beam", "5"],
        cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(8)  # loaded and translating
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err.splitlines()[-1] and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_every_path_flag_refuses_an_empty_path_and_expands_a_tilde(tmp_path, monkeypatch):
    """What an unset "$RUN" gives (`--run-dir ""`) is refused by every command's every path
    flag and argument, before anything runs; `~` after `=` (which the shell leaves alone) is
    the home folder, and a folder literally named `~` is never made."""
    import typer.main

    from mt.cli import app
    from tests.conftest import mt_here

    tried = 0
    for name, cmd in typer.main.get_command(app).commands.items():
        for p in cmd.params:
            if p.metavar not in ("PATH", "FILE", "DIR") and not (
                p.param_type_name == "argument" and "path" in repr(p.type_descriptor).lower()
            ):
                continue
            args = [p.opts[0], ""] if p.param_type_name == "option" else [""]
            code, _, err = mt_here(*name.split(), *args)
            assert code == 2 and "empty path" in err, (name, p.name, err)
            tried += 1
    assert tried >= 20  # (train, translate, eval, export, average, serve, ...)
    # a file where a folder belongs is named as such
    (tmp_path / "a_file").write_text("mine\n")
    code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "a_file")
    assert code == 2 and "is a file: give a folder" in err, err
    code, _, err = mt_here("plot", tmp_path, "-o", tmp_path / "a_file" / "x.png")
    assert code == 2 and "is a file, not a folder" in err, err
    assert (tmp_path / "a_file").read_text() == "mine\n"

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sets = ["data.dir=~/corpus", "train.max_steps=2", "train.valid_every=2"]
    code, _, err = mt_here("train", "tiny", "--run-dir=~/runs/a", "--set", *sets)
    assert code == 0, err
    assert (tmp_path / "runs/a/best.pt").is_file() and (tmp_path / "corpus/train.src").is_file()
    assert not list(tmp_path.rglob("~"))
    assert "downloading" in err and str(tmp_path / "corpus") in err


def test_every_number_flag_and_key_is_finite_and_in_range(tmp_path, tiny_run):
    """nan, infinities and numbers out of a flag's range are one line, never a traceback:
    every float flag of every command, the config's keys, the sampling seed; a nucleus below
    float32's least number still draws the most likely token."""
    import typer.main

    from mt.cli import app
    from mt.config import load_config
    from mt.errors import MTError
    from tests.conftest import mt_here

    tried = 0
    for name, cmd in typer.main.get_command(app).commands.items():
        for p in cmd.params:
            if p.param_type_name == "option" and p.metavar == "X":
                for bad in ("nan", "inf", "-1e309"):
                    code, _, err = mt_here(*name.split(), p.opts[0], bad)
                    assert code == 2 and "finite" in err, (name, p.name, bad, err)
                tried += 1
    assert tried >= 5  # (--length-penalty, --temperature, --topp, ...)
    for key in ("train.lr_factor=nan", "train.clip_norm=inf", "train.max_minutes=1e309",
                "model.dropout=nan", "decode.length_penalty=inf"):  # fmt: skip
        with pytest.raises(MTError, match="finite number"):
            load_config(ROOT / "configs/tiny.yaml", [key])
    for flags, says in ((["--seed", str(2**64)], "--seed"), (["--seed", "-1"], "--seed"),
                        (["--topk", "9" * 30], "--topk")):  # fmt: skip
        code, _, err = mt_here("translate", tiny_run, "--sample", *flags, input="a b\n")
        assert code == 2 and err.startswith(f"error: {says}"), err
    code, out, err = mt_here("translate", tiny_run, "--sample", "--topp", "1e-300",
                             "--seed", "3", input="a b\n")  # fmt: skip
    greedy = mt_here("translate", tiny_run, "--beam", "1", input="a b\n")[1]
    assert code == 0 and out == greedy, err


def test_threads_beyond_the_machine_are_capped_with_a_line(monkeypatch):
    import torch

    from mt.runtime.threads import choose_threads, usable_cores

    said, before = [], torch.get_num_threads()
    try:
        monkeypatch.setenv("MT_THREADS", "99999")
        assert choose_threads(0, said.append) == 4 * usable_cores() == torch.get_num_threads()
        assert len(said) == 1 and "99999" in said[0]
        assert choose_threads(1, said.append) == 1 and len(said) == 1
    finally:
        torch.set_num_threads(before)


def test_a_torchrun_environment_without_torchrun_says_what_it_waits_for(tmp_path, monkeypatch):
    """A leftover torchrun environment: a rank beyond the world is one line at once; rank 0
    of a group whose peers never come says what it waits for before it waits, and ends after
    train.dist_timeout_minutes with one line naming the variables to unset."""
    from tests.conftest import free_port, mt_here

    sets = ["--set", f"data.dir={tmp_path / 'd'}", "train.dist_timeout_minutes=0.05"]
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "a", *sets)
    assert code == 2 and "RANK=5 is not below WORLD_SIZE=2" in err, err
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "a", *sets)
    assert code == 2 and "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2" in err, err
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for port in ("abc", "70000", "0", "9" * 400):  # (before any wait: a port is checked first)
        monkeypatch.setenv("MASTER_PORT", port)
        code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "a", *sets)
        assert code == 2 and "MASTER_PORT=" in err and "1 to 65535" in err, err
        assert err.count("\n") == 1 and len(err) < 300, err
    assert not (tmp_path / "a").exists()
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    start = time.time()
    code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "b", *sets)
    lines = err.splitlines()
    assert code == 2 and time.time() - start < 60, err
    assert "joining a group of 2 processes" in err and "127.0.0.1" in err
    assert lines[-1].startswith("error: the group of 2") and "unset WORLD_SIZE" in lines[-1]


def test_a_prefix_the_models_bpe_cannot_write_is_one_line(tiny_run):
    from tests.conftest import mt_here

    for prefix, unseen in (("A naïve", "'ï'"), ("A São Paulo", "'ã'"), ("ok 😀", "'😀'")):
        code, out, err = mt_here("translate", tiny_run, "--prefix", prefix, input="a b\n")
        assert code == 2 and out == "" and unseen in err and err.count("\n") == 1, err


def test_confidence_intervals_of_a_mostly_empty_output_are_scored(tmp_path):
    """sacreBLEU's chrF bootstrap mixes float and float32 scores where sentences match
    nothing; mt's intervals and paired tests still come out, equal to sacreBLEU's numbers."""
    import sacrebleu

    from tests.conftest import mt_here

    refs = [f"the {w} sat on a mat" for w in ("cat", "dog", "man", "boy", "cow", "hen")]
    hyps = ["the cat sat on the mat", "", "", "", "", ""]
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n")
    (tmp_path / "empty").write_text("\n" * 6)
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    code, out, err = mt_here("eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "ref", "--ci")
    assert code == 0, err
    chrf = sacrebleu.CHRF().corpus_score(hyps, [refs]).score
    assert f"chrF = {chrf:.2f}  (bootstrap mean" in out
    code, out, err = mt_here("eval", "--hyp", tmp_path / "hyp", "--hyp", tmp_path / "empty",
                             "--ref", tmp_path / "ref")  # fmt: skip
    assert code == 0 and "baseline" in out, err


def test_several_references_are_scored_together_and_must_be_parallel(tmp_path):
    """`mt eval --ref A --ref B` is sacreBLEU's multi-reference BLEU, chrF and TER (nrefs:2),
    not the last file alone; references of different lengths are refused."""
    import sacrebleu

    from tests.conftest import mt_here

    hyps = ["the cat sat on the mat today", "a dog ran to the big red house"]
    a = ["the cat sat on a mat today", "a dog runs to the big red house"]
    b = ["a cat sat on the mat today", "a dog ran to the big red home"]
    for name, lines in (("h", hyps), ("a", a), ("b", b), ("short", a[:1])):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    code, out, err = mt_here("eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "a",
                             "--ref", tmp_path / "b", "--json")  # fmt: skip
    assert code == 0, err
    got = json.loads(out)
    assert got["bleu"] == round(sacrebleu.corpus_bleu(hyps, [a, b]).score, 2)
    assert got["chrf"] == round(sacrebleu.corpus_chrf(hyps, [a, b]).score, 2)
    assert got["ter"] == round(sacrebleu.corpus_ter(hyps, [a, b]).score, 2)
    assert "nrefs:2" in got["bleu_signature"]
    assert got["bleu"] != round(sacrebleu.corpus_bleu(hyps, [b]).score, 2)
    code, _, err = mt_here("eval", "--hyp", tmp_path / "h", "--ref", tmp_path / "a",
                           "--ref", tmp_path / "short")  # fmt: skip
    assert code == 2 and "several references must translate the same lines" in err


def test_every_whole_number_flag_refuses_a_long_digit_string_in_one_short_line(tmp_path, tiny_run):
    """A 400-digit value of any whole-number flag of any command is an error line that names
    the flag and does not repeat the 400 digits (the server's flags are refused before it
    listens: an address no machine has stops it if a flag ever passes)."""
    import typer.main

    from mt.cli import app
    from tests.conftest import mt_here

    (tmp_path / "a").write_text("a b\n")
    base = {
        "serve": [tiny_run, "--host", "256.0.0.1"],
        "average": [tiny_run, "-o", tmp_path / "avg.pt"],
        "distill": [tiny_run, "--data", tmp_path / "d", "--out", tmp_path / "o"],
        "translate": [tiny_run],
        "eval": [tiny_run, "--src", tmp_path / "a", "--ref", tmp_path / "a"],
        "attention": [tiny_run, "a b", "-o", tmp_path / "att.png"],
        "download": ["synthetic", "--out", tmp_path / "dl"],
    }
    tried = 0
    for name, cmd in typer.main.get_command(app).commands.items():
        for p in cmd.params:
            if p.param_type_name == "option" and p.metavar == "N" and p.opts[0] != "--seed":
                args = [*base[name], p.opts[0], "9" * 400]
                code, _, err = mt_here(name, *args, input="a b\n")
                said = err.strip().splitlines()[-1]  # (a usage error: click's usage lines first)
                assert code == 2 and said.startswith(("error: ", "Error: ")), (name, p.opts, err)
                assert p.opts[0] in said and len(err) < 400, (name, p.opts, err)
                tried += 1
    assert tried >= 20
    assert not list(tmp_path.glob("*.p*"))


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}])  # fmt: skip
def test_output_text_is_utf8_whatever_the_locale(tmp_path, env):
    """A model whose outputs hold non-ASCII letters, translating to standard output under a
    locale that says ASCII: the translations come out in UTF-8, as a file -o would hold them,
    and a message naming a non-ASCII path comes out whole on standard error."""
    import subprocess
    import sys

    from mt.data.synthetic import generate
    from tests.conftest import cli_env, mt_here

    data = tmp_path / "data"
    data.mkdir()
    umlauts = str.maketrans("AOU", "ÄÖÜ")
    for split, n, seed in (("train", 300, 0), ("valid", 20, 1), ("test", 20, 2)):
        src, tgt = generate(n, seed)
        (data / f"{split}.src").write_text("\n".join(src) + "\n", encoding="utf-8")
        (data / f"{split}.tgt").write_text("\n".join(t.translate(umlauts) for t in tgt) + "\n",
                                           encoding="utf-8")  # fmt: skip
    run = tmp_path / "run"
    code, _, err = mt_here("train", "tiny", "--run-dir", run, "--set", f"data.dir={data}",
                           "train.max_steps=40", "train.valid_every=40", "train.save_every=40",
                           "train.average_last=0")  # fmt: skip
    assert code == 0, err
    lines = (data / "test.src").read_text(encoding="utf-8")
    expected = tmp_path / "expected.txt"
    assert mt_here("translate", run, "-i", data / "test.src", "-o", expected)[0] == 0
    want = expected.read_bytes()
    assert any(c in want.decode() for c in "ÄÖÜ")  # (the case holds what it is about)
    proc = subprocess.run([sys.executable, "-m", "mt", "translate", str(run)], input=lines.encode(),
                          capture_output=True, env=cli_env(**env), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()
    assert proc.stdout == want
    missing = tmp_path / "nö.txt"
    proc = subprocess.run([sys.executable, "-m", "mt", "translate", str(run), "-i", str(missing)],
                          capture_output=True, env=cli_env(**env), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and str(missing).encode() in proc.stderr, proc.stderr
