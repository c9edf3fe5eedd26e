"""`mt report`, `mt average`, `mt tune`, `mt plot`: looking after a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mt.cli.app import _check_beam, _check_device, _err, _number_list, command
from mt.cli.flags import Device
from mt.errors import MTError


@command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="run directory"),
    output: Path = typer.Option(..., "--output", "-o", help="the HTML page to write"),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="another run to compare with (significance on the test split)"
    ),
    src: Path | None = typer.Option(
        None, "--src", help="test source (default: the run's test split)"
    ),
    ref: list[Path] = typer.Option(
        [],
        "--ref",
        help="test references; repeat for several references of the same lines "
        "(multi-reference scores)",
    ),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """One self-contained HTML page about a run: config, curves, validation, tuning, test
    scores with confidence intervals, attention, best and worst translations, a baseline.

    Example: mt report runs/multi30k_de_en --baseline runs/rnn -o report.html
    """
    from mt.evaluate.report import build_report
    from mt.outputs import check_output, write_text

    _check_device(device)
    if (src is None) != (not ref):
        raise MTError("give both --src and --ref, or neither (the run's test split)")
    from mt.artifacts.members import member_dirs

    for d in (member_dirs(run_dir) if run_dir.is_dir() else None) or [run_dir]:
        if not (d / "train_log.jsonl").is_file():
            raise MTError(f"{d} is not a run directory (no train_log.jsonl)")
    if output.suffix.lower() not in (".html", ".htm"):
        raise MTError(
            f"-o {output}: a report is one HTML page; name it {output.stem or 'report'}.html"
        )
    check_output(output, force=force, what="report")
    for path in [src, *ref]:
        if path is not None and not path.is_file():
            raise MTError(f"{path} not found")
    write_text(output, build_report(run_dir, baseline, src, ref, device))
    typer.echo(f"wrote {output}")


@command("average")
def average_cmd(
    run_dir: Path = typer.Argument(..., help="run directory holding step_N.pt snapshots"),
    last: int = typer.Option(5, "--last", min=1, max=1 << 20, help="average the last N snapshots"),
    output: Path = typer.Option(..., "--output", "-o", help="averaged checkpoint to write"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Average the weights of a run's last N checkpoints into one checkpoint.

    Example: mt average runs/multi30k_de_en --last 5 -o runs/multi30k_de_en/avg5.pt
    """
    from mt.artifacts import checkpoint
    from mt.artifacts.average import average
    from mt.outputs import check_output

    if not run_dir.is_dir():
        raise MTError(f"{run_dir} is not a run directory; give the folder of an mt train run")
    paths = checkpoint.snapshots(run_dir)[-last:]
    if len(paths) < last:
        raise MTError(f"{run_dir} has {len(paths)} step_N.pt snapshot(s), fewer than --last {last}")
    check_output(output, force=force, inputs=paths, what="checkpoint")
    checkpoint.atomic_save(average(paths), output)
    typer.echo(f"averaged {', '.join(p.name for p in paths)} -> {output}")


# (declared once here: a flag's type in the signature itself would be made anew at each
# reading of the annotations, and mt.cli.app's metavars set on another copy than Typer's)
TuneSource = Annotated[
    Path | None, typer.Option("--src", help="tuning source (default: the run's valid split)")
]
TuneReferences = Annotated[Path | None, typer.Option("--ref", help="tuning references")]


@command("tune")
def tune_cmd(
    run_dir: Path = typer.Argument(..., help="run directory with best.pt"),
    beams: str | None = typer.Option(
        None, "--beams", help="beam sizes to try, comma-separated (default 1,5,10)"
    ),
    penalties: str | None = typer.Option(
        None, "--length-penalties", help="length penalties to try (default 0.6,1.0,1.4)"
    ),
    nat_length_beams: str | None = typer.Option(
        None, "--nat-length-beams", help="model.arch nat: candidate lengths (default 1,3,5)"
    ),
    nat_iterations: str | None = typer.Option(
        None, "--nat-iterations", help="model.arch nat: mask-predict passes (default 4,10)"
    ),
    src: TuneSource = None,
    ref: TuneReferences = None,
    device: Device = "auto",
):
    """Choose the decoding settings on the valid split and store them in best.pt (what
    decode.tune_beams does at the end of `mt train`): beam size and length penalty, or for a
    model.arch nat run mask-predict's candidate lengths and iterations. Never tune on a test set.

    Example: mt tune runs/multi30k_de_en --beams 1,5,10 --length-penalties 0.6,1.0,1.4
    """
    from mt.artifacts.members import member_dirs

    if (src is None) != (ref is None):
        raise MTError("give both --src and --ref, or neither (the run's valid split)")

    def lists_for(cfg) -> dict:
        nat = cfg.model.arch == "nat"
        return _tuning_lists(nat, beams, penalties, nat_length_beams, nat_iterations)

    dirs = member_dirs(run_dir) if run_dir.is_dir() else None
    if dirs is not None:
        _tune_members(run_dir, dirs, lists_for, src, ref, device)
    else:
        _tune_run(run_dir, lists_for, src, ref, device)


def _tune_run(run_dir: Path, lists_for, src, ref, device: str) -> None:
    """mt tune of a run: the settings kept in its best.pt."""
    from mt.artifacts import checkpoint
    from mt.evaluate.tuning import (
        describe_settings,
        log_tuning,
        refuse_test_split,
        tune_best,
        tuning_pairs,
    )
    from mt.outputs import check_not_training

    if not (run_dir / "best.pt").is_file():
        raise MTError(f"{run_dir}/best.pt not found: tune a run directory that has validated")
    check_not_training(run_dir / "best.pt")
    best = checkpoint.load(run_dir / "best.pt")  # (its settings; tune_best reads it for the work)
    cfg = checkpoint.config_of(best, "best.pt")
    lists = lists_for(cfg)
    refuse_test_split(cfg, src, ref)
    src_lines, ref_lines, pairs = tuning_pairs(cfg, src, ref)
    rec = tune_best(run_dir / "best.pt", src_lines, ref_lines, device, pairs, **lists)
    for g in rec["grid"]:
        typer.echo(f"{describe_settings(g):<50} BLEU {g['valid_bleu']:.2f}")
    log_tuning(run_dir, rec, checkpoint.train_counters(best).get("step", 0))
    chosen = rec["tuned_decoding"]
    was = {k: getattr(cfg.decode, k) for k in chosen if k != "valid_bleu"}
    typer.echo(f"stored in {run_dir / 'best.pt'}: {describe_settings(chosen)}")
    if was != {k: chosen[k] for k in was}:
        typer.echo(f"(it was {describe_settings(was)}: {_retune(run_dir, was)} restores it)")


def _retune(run_dir: Path, settings: dict) -> str:
    """The mt tune command whose one-point grid stores `settings` again."""
    flags = {
        "beam": "--beams",
        "length_penalty": "--length-penalties",
        "nat_length_beam": "--nat-length-beams",
        "nat_iterations": "--nat-iterations",
    }
    return f"mt tune {run_dir} " + " ".join(f"{flags[k]} {v}" for k, v in settings.items())


def _tune_members(run_dir: Path, dirs: list[Path], lists_for, src, ref, device: str) -> None:
    """mt tune of a run of several members: their ensemble, kept in RUN_DIR/ensemble.json
    (each member's best.pt keeps its own settings, for use alone)."""
    from mt.artifacts import checkpoint
    from mt.artifacts.members import ENSEMBLE_FILE
    from mt.evaluate.tuning import describe_settings, refuse_test_split, tune_ensemble, tuning_pairs

    for d in dirs:
        if not (d / "best.pt").is_file():
            raise MTError(f"{d}/best.pt not found: tune a run whose members have validated")
    cfg = checkpoint.config_of(checkpoint.load(dirs[0] / "best.pt"), "best.pt")
    lists = lists_for(cfg)
    refuse_test_split(cfg, src, ref)
    src_lines, ref_lines, pairs = tuning_pairs(cfg, src, ref)
    rec = tune_ensemble(run_dir, src_lines, ref_lines, device, pairs, **lists)
    for g in rec["grid"]:
        typer.echo(f"{describe_settings(g):<50} BLEU {g['valid_bleu']:.2f}")
    best = describe_settings(rec["tuned_decoding"])
    typer.echo(f"stored in {run_dir / ENSEMBLE_FILE} for the ensemble of {len(dirs)}: {best}")


def _tuning_lists(nat: bool, beams, penalties, nat_length_beams, nat_iterations) -> dict:
    """mt tune's grid flags for this kind of model, checked; the other kind's are refused."""
    if nat:
        if beams is not None or penalties is not None:
            raise MTError(
                "--beams and --length-penalties: this run (model.arch nat) decodes by "
                "mask-predict; tune --nat-length-beams and --nat-iterations"
            )
        lengths = _number_list(_or(nat_length_beams, "1,3,5"), int, "--nat-length-beams")
        its = _number_list(_or(nat_iterations, "4,10"), int, "--nat-iterations")
        if not lengths or not its or min(lengths + its) < 1:
            raise MTError("--nat-length-beams and --nat-iterations need values >= 1")
        return {"beams": [], "penalties": [], "nat_length_beams": lengths, "nat_iterations": its}
    if nat_length_beams is not None or nat_iterations is not None:
        raise MTError(
            "--nat-length-beams and --nat-iterations apply to model.arch nat runs; this run "
            "searches: tune --beams and --length-penalties"
        )
    beam_list = _number_list(_or(beams, "1,5,10"), int, "--beams")
    lp_list = _number_list(_or(penalties, "0.6,1.0,1.4"), float, "--length-penalties")
    if not beam_list or min(beam_list) < 1 or not lp_list or min(lp_list) < 0:
        raise MTError("--beams needs sizes >= 1 and --length-penalties values >= 0")
    _check_beam(max(beam_list))
    return {"beams": beam_list, "penalties": lp_list}


def _or(given: str | None, default: str) -> str:
    return default if given is None else given  # ("" is given: refused, not the default)


@command("plot")
def plot_cmd(
    run_dir: Path = typer.Argument(..., help="run directory with train_log.jsonl"),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="picture to write, in the format its name ends in (.png, .svg, .pdf, ...); "
        "default RUN_DIR/training.png",
    ),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Draw the training curve (training/validation loss, validation BLEU) as a PNG.

    Example: mt plot runs/multi30k_de_en
    """
    from mt.evaluate.plot import plot_run
    from mt.outputs import check_folder_writable, check_output, picture_format

    if output is None:  # the run's own picture, redrawn as training redraws it
        if run_dir.is_dir():
            try:
                check_folder_writable(run_dir, "run")
            except MTError as e:
                raise MTError(f"{e}; or draw it elsewhere with -o PICTURE.png") from None
    else:
        picture_format(output)  # (out.txt is refused, out.svg is an SVG)
        check_output(output, force=force, inputs=[run_dir / "train_log.jsonl"], what="picture")
    typer.echo(f"wrote {plot_run(run_dir, output)}")


@command("distill")
def distill_cmd(
    teacher: Path = typer.Argument(..., help="the teacher: run directory or checkpoint"),
    data: Path = typer.Option(..., "--data", help="corpus folder with the training split"),
    out: Path = typer.Option(..., "--out", help="folder for the distilled corpus"),
    beam: int | None = typer.Option(None, "--beam", min=1, help="default: the teacher's"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
    force: bool = typer.Option(False, "--force", help="overwrite files in --out"),
):
    """Sequence-level knowledge distillation: the teacher's translations of the training
    sources become the training targets of a new corpus (valid/test copied unchanged); a
    teacher of several pairs distils each pair into files of its own (train.en-fr.fr, ...).

    Example: mt distill runs/multi30k_de_en --data data/multi30k --out data/multi30k_kd
    """
    from mt.train.distill import distill

    _check_device(device)
    _check_beam(beam)
    n = distill(teacher, data, out, beam, device, force, log=_err)
    typer.echo(f"wrote {out}: {n} training pairs with the teacher's translations")
