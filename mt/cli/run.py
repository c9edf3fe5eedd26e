"""`mt download`, `mt configs`, `mt train`: from a corpus to a trained run."""

from __future__ import annotations

from pathlib import Path

import typer

from mt.cli.app import _err, command, exit_if_stopped_by
from mt.errors import MTError


@command("download")
def download_cmd(
    name: str = typer.Argument(..., help="multi30k, wmt14, synthetic, or a hub dataset id"),
    out: Path = typer.Option(..., "--out", "-o", help="folder to write {train,valid,test}.{lang}"),
    from_dir: Path | None = typer.Option(
        None,
        "--from-dir",
        help="import local files (Multi30k raw layout, plain splits, or a "
        "datasets save_to_disk folder) instead of the hub",
    ),
    config: str | None = typer.Option(None, "--config", help="hub dataset config, e.g. de-en"),
    src: str | None = typer.Option(None, "--src", help="source language / column"),
    tgt: str | None = typer.Option(None, "--tgt", help="target language / column"),
    force: bool = typer.Option(False, "--force", help="overwrite existing split files"),
    valid_size: int = typer.Option(
        0,
        "--valid-size",
        min=0,
        max=1 << 30,
        help="a corpus without a valid split: draw this many training pairs as one",
    ),
):
    """Fetch a parallel corpus and write plain text splits.

    \b
    Example: mt download multi30k --out data/multi30k
    Offline: mt download multi30k --from-dir ~/multi30k/data/task1/raw --out data/multi30k
    A table: mt download mine --from-dir pairs.tsv --src en --tgt de --valid-size 1000 \\
      --out data/mine
    """
    from mt.data.download import download

    if (src is None) != (tgt is None):
        raise MTError("give both --src and --tgt, or neither")
    counts = download(
        name,
        out,
        config=config,
        from_path=from_dir,
        langs=(src, tgt) if src and tgt else None,
        force=force,
        valid_size=valid_size,
    )
    for split, n in counts.items():
        typer.echo(f"{split}: {n} pairs")
    typer.echo(f"wrote {out}")


@command("configs")
def configs_cmd():
    """List the built-in configs: `mt train NAME` finds them from any folder.

    Example: mt configs
    """
    from mt.config import builtin_configs, describe_config

    for name, path in builtin_configs().items():
        typer.echo(f"{name:<20} {describe_config(path)}")
    typer.echo(f"(files in {next(iter(builtin_configs().values())).parent}; copy one to change it)")


@command("train")
def train_cmd(
    config: Path = typer.Argument(
        ...,
        help="YAML config, e.g. configs/multi30k_de_en.yaml, or "
        "a built-in config's name (mt configs lists them)",
    ),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="default: runs/<config name>"),
    overrides: list[str] = typer.Option(
        [], "--set", help="override a key: --set train.max_steps=500", metavar="KEY=VALUE"
    ),
    more: list[str] | None = typer.Argument(
        None, help="more KEY=VALUE overrides after --set", show_default=False, metavar="KEY=VALUE"
    ),
    allow_config_change: bool = typer.Option(
        False, "--allow-config-change", help="continue a run dir that holds a different config"
    ),
    restart: bool = typer.Option(
        False,
        "--restart",
        help="start again from step 0; the run directory's files are moved to "
        "RUN_DIR/replaced-<time>/ first",
    ),
):
    """Train BPE and a Transformer; rerunning on the same run dir resumes from last.pt.

    Example: mt train configs/multi30k_de_en.yaml --set data.dir=data/multi30k
    """
    from mt.train.build import build_trainer, load_run_config

    sets = list(overrides) + list(more or [])
    cfg = load_run_config(config, sets, log=_err)
    run_dir = run_dir or Path("runs") / config.stem
    if cfg.train.members > 1:
        from mt.train.members import train_members

        status = train_members(config, sets, cfg, run_dir, allow_config_change, restart, _err)
        raise typer.Exit(status)
    trainer = build_trainer(cfg, run_dir, allow_config_change, log=_err, restart=restart)
    try:
        state = trainer.fit()
    finally:
        trainer.close()
    if trainer.dist.is_main:
        best = f"best valid BLEU {state.best_bleu:.2f}" if state.best_bleu >= 0 else "not validated"
        _err(f"stopped at step {state.step}; {best}; checkpoints in {run_dir}")
    exit_if_stopped_by(trainer.stop_signal)


@command("pretrain")
def pretrain_cmd(
    config: Path = typer.Argument(
        ...,
        help="YAML config or built-in name: its data, tokenizer "
        "and model (the encoder is trained), train.max_steps etc.",
    ),
    run_dir: Path = typer.Option(..., "--run-dir", help="where pretrained.pt is written"),
    overrides: list[str] = typer.Option(
        [], "--set", help="override a key: --set train.max_steps=500", metavar="KEY=VALUE"
    ),
    more: list[str] | None = typer.Argument(
        None, help="more KEY=VALUE overrides after --set", show_default=False, metavar="KEY=VALUE"
    ),
    restart: bool = typer.Option(
        False,
        "--restart",
        help="start again from step 0; the run directory's files are moved to "
        "RUN_DIR/replaced-<time>/ first",
    ),
):
    """Masked-LM pretraining of the encoder on the training split's source side (BERT's 15%
    masking); then start translation runs from it with model.init_encoder=RUN_DIR/pretrained.pt.

    Example: mt pretrain multi30k_de_en --run-dir runs/mlm_de --set train.max_steps=2000
    """
    from mt.train.build import load_run_config
    from mt.train.pretrain import pretrain

    cfg = load_run_config(config, list(overrides) + list(more or []), log=_err)
    record = pretrain(cfg, run_dir, log=_err, restart=restart)
    if record["stopped"]:
        if record["is_main"]:
            _err(
                f"stopped at step {record['step']}; last.pt in {run_dir}: run the same command "
                f"again to resume"
            )
        exit_if_stopped_by(record["stopped"])
    if not record["is_main"]:
        return
    typer.echo(
        f"wrote {run_dir / 'pretrained.pt'} after {record['step']} updates "
        f"(masked-LM loss {record['mlm_loss'] if record['mlm_loss'] is not None else '-'})"
    )
