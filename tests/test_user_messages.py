"""Mistakes a new user makes, each answered by a line that names the real problem and its fix
(or a note where the command goes ahead), never a silent default or a misleading message."""

import json
import os
import shutil

import pytest

from mt.artifacts import checkpoint
from tests.conftest import mt_here


def _copy(run, tmp_path, name="run"):
    return shutil.copytree(run, tmp_path / name)


def _train_data(run):
    return checkpoint.config_of(checkpoint.load(run / "best.pt"), "best.pt").data


def test_tune_refuses_an_empty_grid_and_the_test_split(tiny_run, tmp_path):
    """--beams "" is refused (it tuned the defaults and rewrote best.pt), and so is tuning
    on the run's own test split, which the help says never to do; best.pt stays as it was."""
    run = _copy(tiny_run, tmp_path)
    before = (run / "best.pt").read_bytes()
    code, _, err = mt_here("tune", run, "--beams", "")
    assert code == 2 and "--beams ''" in err and "comma-separated" in err, err
    code, _, err = mt_here("tune", run, "--length-penalties", " , ")
    assert code == 2 and "--length-penalties" in err, err
    d = _train_data(run)
    test_src, test_ref = (f"{d.dir}/test.{d.src_lang}", f"{d.dir}/test.{d.tgt_lang}")
    code, _, err = mt_here("tune", run, "--src", test_src, "--ref", test_ref)
    assert code == 2 and "is the run's test split" in err, err
    assert (run / "best.pt").read_bytes() == before


def test_mt_report_shows_what_mt_tune_chose(tiny_run, tmp_path):
    from mt.evaluate.report import _tuning

    run = _copy(tiny_run, tmp_path)
    code, _, err = mt_here("tune", run, "--beams", "1,2", "--length-penalties", "1.0")
    assert code == 0, err
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    tuned = [r for r in records if r.get("tuned_by") == "mt tune"]
    assert len(tuned) == 1 and len(tuned[0]["grid"]) == 2
    html = _tuning(records)
    assert "No decoding tuning" not in html and "chosen" in html


def test_mt_tune_says_how_to_restore_what_it_replaced(tiny_run, tmp_path):
    """mt tune rewrites best.pt's decoding settings: the ones it replaced are printed with the
    command that stores them again, which does."""
    run = _copy(tiny_run, tmp_path)
    before = _decoding(run)
    other = 3 if before[0] != 3 else 2  # (a beam: greedy search has no length penalty)
    code, out, err = mt_here("tune", run, "--beams", str(other), "--length-penalties", "0.25")
    assert code == 0 and _decoding(run)[:2] == (other, 0.25), err
    said = out.splitlines()[-1]
    assert f"it was beam {before[0]}, length penalty {before[1]}" in said, out
    restore = said.split(": ", 1)[1].removesuffix(" restores it)").split()
    assert restore[:3] == ["mt", "tune", str(run)], said
    code, _, err = mt_here(*restore[1:])
    assert code == 0 and _decoding(run)[:2] == before[:2], err


def _decoding(run) -> tuple:
    decode = checkpoint.load(run / "best.pt")["config"]["decode"]
    return decode["beam"], decode["length_penalty"], decode


def test_a_damaged_best_pt_is_said_and_set_aside_on_resume(tiny_run, tmp_path):
    """Translating with a damaged best.pt names the run's other checkpoint (not the damaged
    one); resuming moves it aside, says so, and the next validation writes a new best.pt."""
    run = _copy(tiny_run, tmp_path)
    (run / "best.pt").write_bytes((run / "best.pt").read_bytes()[:5000])  # a copy cut short
    code, _, err = mt_here("translate", run / "best.pt", input="mi lo\n")
    assert code == 2 and f"use {run / 'last.pt'} instead" in err, err
    step = checkpoint.train_counters(checkpoint.load(run / "last.pt"))["step"]
    code, _, err = mt_here("train", "tiny", "--run-dir", run, "--set",
                           f"data.dir={_train_data(tiny_run).dir}", f"train.max_steps={step + 2}",
                           "train.valid_every=2", "train.save_every=2")  # fmt: skip
    assert code == 0, err
    assert "best.pt.damaged" in err and (run / "best.pt.damaged").is_file()
    assert checkpoint.train_counters(checkpoint.load(run / "best.pt"))["step"] == step + 2


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_split_that_is_not_a_text_file_is_named(tiny_run, tmp_path, kind):
    data = shutil.copytree(_train_data(tiny_run).dir, tmp_path / "data")
    (data / "train.src").unlink()
    if kind == "folder":
        (data / "train.src").mkdir()
    else:
        os.mkfifo(data / "train.src")
    code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "r", "--set",
                           f"data.dir={data}")  # fmt: skip
    needle = "is a folder" if kind == "folder" else "is not a regular file"
    assert code == 2 and f"{data / 'train.src'} {needle}" in err, err


def test_settings_a_user_gets_wrong_are_answered(tiny_run, tmp_path):
    """ddp without torchrun: a note, and the run goes on; model.init_encoder takes a run
    directory as every command does; a key as other toolkits spell it is pointed to mt's;
    data.pair_temperature on one pair is said to do nothing; the synthetic corpus asked for
    a language it lacks is refused before anything is written."""
    data = _train_data(tiny_run).dir
    common = ["train", "tiny", "--set", f"data.dir={data}", "train.max_steps=2",
              "train.valid_every=2", "train.save_every=2", "train.average_last=0"]  # fmt: skip
    code, _, err = mt_here(*common, "train.data_parallel=ddp", "--run-dir", tmp_path / "a")
    assert code == 0 and "applies to several processes" in err, err
    code, _, err = mt_here(*common, f"model.init_encoder={tiny_run}", "--run-dir", tmp_path / "b")
    assert code == 0 and "encoder initialised from" in err, err
    code, _, err = mt_here(*common, "train.warmup_steps=10", "--run-dir", tmp_path / "c")
    assert code == 2 and "did you mean 'warmup'" in err, err
    code, _, err = mt_here(*common, "data.pair_temperature=5", "--run-dir", tmp_path / "e")
    assert code == 0 and "this run has one pair, so it does nothing" in err, err
    synthetic = ["train", "tiny", "--set", f"data.dir={tmp_path / 'empty'}", "data.src_lang=no"]
    code, _, err = mt_here(*synthetic, "--run-dir", tmp_path / "d")
    assert code == 2 and "languages src and tgt, not 'no'" in err and "downloading" not in err, err
    assert not (tmp_path / "empty").exists()


def test_download_says_what_it_cannot_do(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "val"):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("a b\nc d\n", encoding="utf-8")
    code, _, err = mt_here("download", "multi30k", "--from-dir", raw, "--out", tmp_path / "o",
                           "--config", "de-en")  # fmt: skip
    assert code == 2 and "--config de-en" in err and "--from-dir has none" in err, err
    code, _, err = mt_here("download", "multi30k", "--out", tmp_path / "o", "--config", "de-en")
    assert code == 2 and "one configuration" in err and "--src and --tgt" in err, err
    code, _, err = mt_here("download", "multi30k", "--from-dir", raw, "--out", tmp_path / "o")
    assert code == 0 and "no test split found" in err, err
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if "." in p.name[1:]) == [
        "train.de", "train.en", "valid.de", "valid.en",
    ]  # fmt: skip


def test_plot_on_a_read_only_run_folder_suggests_another_output(tiny_run, monkeypatch):
    """(The folder made read-only as a mount would make it: root writes through chmod.)"""
    import mt.outputs
    from mt.errors import MTError

    def read_only(folder, what="output"):
        raise MTError(f"{what} folder {folder} is not writable (Read-only file system)")

    monkeypatch.setattr(mt.outputs, "check_folder_writable", read_only)
    code, _, err = mt_here("plot", tiny_run)
    assert code == 2 and "Read-only" in err and "-o PICTURE.png" in err, err


def test_a_relative_data_dir_that_cannot_be_fetched_says_where_it_was_looked_for(
    tmp_path, monkeypatch
):
    """A config run from another folder than its paths start from: the download it falls
    back on fails (no hub here), and the line says data.dir was relative to this folder."""
    monkeypatch.chdir(tmp_path)
    sets = ["data.dir=corpus/m30k", "data.dataset=multi30k", "data.src_lang=en", "data.tgt_lang=de"]
    code, _, err = mt_here("train", "tiny", "--run-dir", "r", "--set", *sets)
    assert code == 2 and "is relative to the current folder" in err and str(tmp_path) in err, err
    assert not (tmp_path / "corpus").exists() or not any((tmp_path / "corpus").rglob("*.en"))


def test_translating_a_run_that_has_not_validated_says_which_step(tiny_run, tmp_path):
    """A run with no best.pt yet is translated with its last.pt: the line says so, and at
    which step (a user otherwise takes it for the validated model)."""
    run = _copy(tiny_run, tmp_path)
    (run / "best.pt").unlink()
    step = checkpoint.trained_steps(checkpoint.load(run / "last.pt"))
    code, out, err = mt_here("translate", run, input="a b c\n")
    assert code == 0 and out.strip(), err
    assert f"last.pt (step {step:,}: the run has not validated yet" in err, err
    code, _, err = mt_here("translate", tiny_run, input="a b c\n")
    assert code == 0 and "not validated" not in err, err
