import json
import shutil

import torch

from mt.artifacts import checkpoint
from mt.artifacts.average import average
from mt.decode.translator import Translator
from tests.conftest import ROOT, assert_user_error, run_mt, run_tiny


def test_averaging_identical_checkpoints_is_identity(tiny_run, tmp_path):
    path = tiny_run / "last.pt"
    avg = average([path, path, path])
    orig = checkpoint.load(path)
    for k, v in orig["model"].items():
        torch.testing.assert_close(avg["model"][k], v, rtol=0, atol=1e-7)
        assert avg["model"][k].dtype == v.dtype


def test_averaging_different_checkpoints_gives_their_mean(tiny_run, tmp_path):
    """Two snapshots of one run, at different steps: every float weight of the average is
    their element-wise mean, the config and BPE model come from the later one."""
    first, second = checkpoint.snapshots(tiny_run)[-2:]
    a, b = checkpoint.load(first), checkpoint.load(second)
    assert any(not torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    avg = average([first, second])
    for k, v in a["model"].items():
        torch.testing.assert_close(
            avg["model"][k],
            (v.double() + b["model"][k].double()).div(2).to(v.dtype),
            rtol=0,
            atol=1e-7,
        )
    assert avg["train_state"] == b["train_state"] and avg["averaged_from"] == [
        first.name,
        second.name,
    ]


def test_averaged_checkpoint_loads_and_translates(tiny_run, tmp_path):
    snaps = checkpoint.snapshots(tiny_run)
    assert snaps, "training keeps step_N.pt snapshots"
    proc = run_mt("average", tiny_run, "--last", "1", "-o", tmp_path / "avg.pt")
    assert proc.returncode == 0, proc.stderr
    a = average([snaps[-1], tiny_run / "last.pt"])
    checkpoint.atomic_save(a, tmp_path / "avg2.pt")
    out = Translator.from_checkpoint(tmp_path / "avg2.pt", "cpu").translate(["lo ka", "", "mi"])
    assert len(out) == 3 and out[1] == ""
    assert_user_error(
        run_mt("average", tiny_run, "--last", "99", "-o", tmp_path / "x.pt"), "fewer than --last 99"
    )
    assert_user_error(
        run_mt("average", tiny_run, "--last", "1", "-o", tmp_path / "avg.pt"), "already exists"
    )


def test_early_stopping_after_patience_validations(tmp_path):
    # With a vanishing learning rate the model never changes, so BLEU never improves after
    # the first validation: patience 2 stops at the third validation.
    proc = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "r",
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "train.lr_factor=1e-12",
        "train.max_steps=1000",
        "train.valid_every=5",
        "train.patience=2",
        "train.valid_beam=1",
        "train.log_every=5",
        "decode.max_len_b=2",
    )
    assert proc.returncode == 0, proc.stderr
    assert "early stop" in proc.stderr
    log = [json.loads(x) for x in (tmp_path / "r/train_log.jsonl").read_text().splitlines()]
    valids = [r for r in log if "valid_bleu" in r]
    assert [r["step"] for r in valids] == [5, 10, 15]
    assert checkpoint.load(tmp_path / "r/last.pt")["train_state"]["step"] == 15
    assert (tmp_path / "r/training.png").stat().st_size > 0


def test_plot_command_redraws(tiny_run, tmp_path):
    proc = run_mt("plot", tiny_run, "-o", tmp_path / "c.png")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert_user_error(run_mt("plot", tmp_path), "train_log.jsonl")


# the first bytes of each format: what a viewer of that name's ending expects to open
MAGIC = {"png": b"\x89PNG", "svg": b"<?xml", "pdf": b"%PDF", "jpg": b"\xff\xd8\xff", "eps": b"%!PS"}


def test_a_picture_is_written_in_the_format_its_name_asks_for(tiny_run, tmp_path):
    from tests.conftest import mt_here

    for ending, magic in MAGIC.items():
        out = tmp_path / f"curve.{ending}"
        code, _, err = mt_here("plot", tiny_run, "-o", out)
        assert code == 0 and out.read_bytes()[: len(magic)] == magic, (ending, err)
    out = tmp_path / "attention.svg"
    code, _, err = mt_here("attention", tiny_run, "a b c", "-o", out, "--device", "cpu")
    assert code == 0 and out.read_bytes()[:5] == b"<?xml", err
    for name in ("curve.txt", "curve"):
        code, _, err = mt_here("plot", tiny_run, "-o", tmp_path / name)
        assert code == 2 and "curve.png" in err and not (tmp_path / name).exists(), err
    code, _, err = mt_here("report", tiny_run, "-o", tmp_path / "r.pdf")
    assert code == 2 and "r.html" in err and not (tmp_path / "r.pdf").exists(), err


def _tuning_of(run, data, keys: tuple[str, ...]) -> dict:
    """The run's tuning record, checked: its winner has the grid's best valid BLEU, best.pt
    holds the winner's settings (`keys`), and translating the valid split with them gives
    exactly that BLEU."""
    from mt.data.corpus import read_lines
    from mt.evaluate.metrics import score

    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    (tuned,) = [r for r in records if "tuned_decoding" in r]
    best = tuned["tuned_decoding"]
    assert best["valid_bleu"] == max(g["valid_bleu"] for g in tuned["grid"])
    tr = Translator.from_checkpoint(run, "cpu")
    assert tuple(getattr(tr.cfg, k) for k in keys) == tuple(best[k] for k in keys)
    src, ref = read_lines(data / "valid.src"), read_lines(data / "valid.tgt")
    assert round(score(tr.translate(src), ref).bleu, 2) == best["valid_bleu"]
    return tuned


def test_decoding_is_tuned_on_valid_and_stored_in_best(tmp_path):
    """decode.tune_beams: the grid is scored on the valid split, the winner is written into
    best.pt, and `mt translate RUN_DIR` uses it; the reported BLEU is the valid BLEU of
    exactly that setting."""
    run = tmp_path / "run"
    grid = ["decode.tune_beams=[1,3]", "decode.tune_length_penalties=[0.5,1.5]"]
    run_tiny(run, tmp_path / "data", "train.max_steps=40", "train.valid_every=40", *grid)
    tuned = _tuning_of(run, tmp_path / "data", ("beam", "length_penalty"))
    assert [(g["beam"], g["length_penalty"]) for g in tuned["grid"]] == [
        (1, 1.0),
        (3, 0.5),
        (3, 1.5),
    ]
    # `mt tune` does the same for an existing run, here with a one-point grid
    proc = run_mt("tune", run, "--beams", "2", "--length-penalties", "0.7")
    assert proc.returncode == 0, proc.stderr
    tr = Translator.from_checkpoint(run, "cpu")
    assert (tr.cfg.beam, tr.cfg.length_penalty) == (2, 0.7)
    assert "beam 2, length penalty 0.7" in proc.stdout and "stored in" in proc.stdout
    assert_user_error(run_mt("tune", run, "--beams", "0"), "--beams")
    assert_user_error(run_mt("tune", run, "--nat-iterations", "3"), "apply to model.arch nat")
    src = tmp_path / "data" / "valid.src"
    assert_user_error(run_mt("tune", run, "--src", src), "both --src and --ref")
    shutil.rmtree(run)


def test_a_nat_run_tunes_mask_predict_s_own_knobs(tmp_path):
    """model.arch nat: the grid is candidate lengths x iterations (not beams it ignores), the
    winner is stored in best.pt and used by mt translate; mt tune does the same."""
    run = tmp_path / "nat"
    proc = run_mt(
        "train", "tiny", "--run-dir", run, "--set", f"data.dir={tmp_path / 'data'}",
        "model.arch=nat", "train.max_steps=30", "train.valid_every=30", "train.average_last=0",
        "decode.tune_beams=[5]", "decode.tune_nat_length_beams=[1,2]",
        "decode.tune_nat_iterations=[1,3]",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "mask-predict" in proc.stderr and "stored in best.pt" in proc.stderr
    tuned = _tuning_of(run, tmp_path / "data", ("nat_length_beam", "nat_iterations"))
    grid = [(g["nat_length_beam"], g["nat_iterations"]) for g in tuned["grid"]]
    assert grid == [(1, 1), (1, 3), (2, 1), (2, 3)] and "beam" not in tuned["tuned_decoding"]
    proc = run_mt("tune", run, "--nat-length-beams", "3", "--nat-iterations", "2")
    assert proc.returncode == 0, proc.stderr
    tr = Translator.from_checkpoint(run, "cpu")
    assert (tr.cfg.nat_length_beam, tr.cfg.nat_iterations) == (3, 2)
    assert_user_error(run_mt("tune", run, "--beams", "5"), "--nat-length-beams")


def test_training_picture_marks_best_and_draws_a_single_point(tmp_path):
    import json

    from mt.evaluate.plot import plot_run, training_figure

    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 10, "loss": 5.0, "nll": 4.5},
                {
                    "step": 10,
                    "valid_loss": 4.0,
                    "valid_bleu": 12.3,
                    "valid_chrf": 30.0,
                    "best": True,
                },
            ]
        )
        + "\n"
    )
    assert plot_run(run).is_file()
    loss_ax, bleu_ax = training_figure(run).axes
    assert any(
        line.get_marker() == "o" and len(line.get_xdata()) == 1 for line in loss_ax.get_lines()
    )  # one point is still seen
    assert "best.pt: 12.30" in [t.get_text() for t in bleu_ax.get_legend().get_texts()]


def test_snapshots_of_two_runs_of_one_shape_are_not_averaged(tiny_run, tmp_path):
    """A snapshot copied in from another run (another seed, the same model shape) is refused
    by its run id, and, in checkpoints from before runs had one, by its seed."""
    from tests.conftest import mt_here

    other = tmp_path / "other"
    code, _, err = mt_here("train", "tiny", "--run-dir", other, "--set",
                           f"data.dir={tmp_path / 'data'}", "train.seed=99", "train.max_steps=30",
                           "train.save_every=30", "train.valid_every=30")  # fmt: skip
    assert code == 0, err
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_run, mixed)
    last = checkpoint.snapshots(mixed)[-1]
    step = int(last.stem.split("_")[1])
    intruder = mixed / f"step_{step + 1}.pt"
    shutil.copy(checkpoint.snapshots(other)[-1], intruder)
    assert_user_error(
        run_mt("average", mixed, "--last", "2", "-o", tmp_path / "avg.pt"),
        "comes from another run",
        "step_",
        "--last",
    )
    assert not (tmp_path / "avg.pt").exists()
    for path in (last, intruder):  # as saved before runs had an id
        ckpt = checkpoint.load(path)
        del ckpt["train_state"]["run_id"]
        checkpoint.atomic_save(ckpt, path)
    assert_user_error(
        run_mt("average", mixed, "--last", "2", "-o", tmp_path / "avg.pt"), "train.seed", "99"
    )
    intruder.unlink()  # one run's snapshots still average
    assert run_mt("average", mixed, "--last", "2", "-o", tmp_path / "avg.pt").returncode == 0


def test_the_training_picture_is_drawn_off_the_training_thread(tiny_run, tmp_path, monkeypatch):
    """A validation's redraw returns at once (the drawing, seconds of matplotlib, runs on a
    thread of its own); one that finds a drawing under way leaves it; the run's end waits for
    it and draws the last picture itself, with what the log holds then."""
    import threading
    import time

    from mt.evaluate import plot
    from mt.train.finish import draw_training_picture

    run = shutil.copytree(tiny_run, tmp_path / "run")
    (run / "training.png").unlink(missing_ok=True)
    drawn, gate, real = [], threading.Event(), plot.plot_run

    def slow_plot(run_dir, out=None):
        gate.wait(10)
        drawn.append(threading.current_thread().name)
        return real(run_dir, out)

    monkeypatch.setattr(plot, "plot_run", slow_plot)
    started = time.monotonic()
    draw_training_picture(run, print)
    draw_training_picture(run, print)  # (a drawing is under way: left to it)
    assert time.monotonic() - started < 1 and not drawn
    gate.set()
    draw_training_picture(run, print, wait=True)
    assert drawn == ["training.png", threading.current_thread().name], drawn
    assert (run / "training.png").read_bytes().startswith(b"\x89PNG")
