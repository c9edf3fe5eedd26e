"""The `mt` command line. Commands parse flags and delegate; a user error (MTError) is one
line on stderr and exit status 2, never a traceback."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from mt.errors import MTError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # plain one-line usage errors, no boxes
                  help="Train, run and score Transformer translation models.")


def _print_version(value: bool) -> None:
    if value:
        import mt
        typer.echo(f"mt {mt.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version,
                                       is_eager=True, help="print the version and exit")):
    """Train, run and score Transformer translation models."""


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def command(name: str):
    """Register a command whose MTError becomes one line on stderr and exit status 2."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except MTError as e:
                _err(f"error: {e}")
                raise typer.Exit(2)
            except OSError as e:
                if e.filename is None:
                    raise
                # a file mt reads or writes along the way (a log, a config, a BPE model)
                from mt.outputs import describe_os_error
                _err(f"error: {describe_os_error(e)}")
                raise typer.Exit(2)
        return app.command(name)(run)
    return wrap


@command("download")
def download_cmd(
    name: str = typer.Argument(..., help="multi30k, wmt14, synthetic, or a hub dataset id"),
    out: Path = typer.Option(..., "--out", "-o", help="folder to write {train,valid,test}.{lang}"),
    from_dir: Optional[Path] = typer.Option(
        None, "--from-dir", help="import local files (Multi30k raw layout, plain splits, or a "
                                 "datasets save_to_disk folder) instead of the hub"),
    config: Optional[str] = typer.Option(None, "--config", help="hub dataset config, e.g. de-en"),
    src: Optional[str] = typer.Option(None, "--src", help="source language / column"),
    tgt: Optional[str] = typer.Option(None, "--tgt", help="target language / column"),
    force: bool = typer.Option(False, "--force", help="overwrite existing split files"),
):
    """Fetch a parallel corpus and write plain text splits.

    Example: mt download multi30k --out data/multi30k
    Offline:  mt download multi30k --from-dir ~/multi30k/data/task1/raw --out data/multi30k
    """
    from mt.data.download import download
    if (src is None) != (tgt is None):
        raise MTError("give both --src and --tgt, or neither")
    counts = download(name, out, config=config, from_path=from_dir,
                      langs=(src, tgt) if src else None, force=force)
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
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/multi30k_de_en.yaml, or "
                                            "a built-in config's name (mt configs lists them)"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="default: runs/<config name>"),
    overrides: List[str] = typer.Option([], "--set", help="override a key: --set train.max_steps=500"),
    more: Optional[List[str]] = typer.Argument(None, help="more KEY=VALUE overrides after --set",
                                               show_default=False),
    allow_config_change: bool = typer.Option(
        False, "--allow-config-change", help="continue a run dir that holds a different config"),
):
    """Train BPE and a Transformer; rerunning on the same run dir resumes from last.pt.

    Example: mt train configs/multi30k_de_en.yaml --set data.dir=data/multi30k
    """
    from mt.build import build_trainer
    from mt.config import load_config
    cfg = load_config(config, list(overrides) + list(more or []))
    run_dir = run_dir or Path("runs") / config.stem
    trainer = build_trainer(cfg, run_dir, allow_config_change, log=_err)
    try:
        state = trainer.fit()
    finally:
        trainer.close()
    if not trainer.dist.is_main:
        return
    best = f"best valid BLEU {state.best_bleu:.2f}" if state.best_bleu >= 0 else "not validated yet"
    _err(f"stopped at step {state.step}; {best}; checkpoints in {run_dir}")


def _check_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda"):
        raise MTError(f"--device {device!r}: use auto, cpu or cuda")


def _check_beam(beam: Optional[int]) -> None:
    from mt.config import MAX_BEAM
    if beam is not None and beam > MAX_BEAM:
        raise MTError(f"--beam {beam}: at most {MAX_BEAM} (BLEU stops improving after a beam of "
                      f"about 10, and decoding time grows with the beam); use a smaller --beam")


@command("translate")
def translate_cmd(
    models: List[Path] = typer.Argument(..., help="run directory (best.pt, else last.pt) or "
                                        "checkpoint; several: an ensemble"),
    input: Optional[Path] = typer.Option(None, "-i", "--input", help="default stdin"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="default stdout"),
    beam: Optional[int] = typer.Option(None, "--beam", min=1, help="default: the config's"),
    greedy: bool = typer.Option(False, "--greedy", help="greedy search (= --beam 1)"),
    length_penalty: Optional[float] = typer.Option(None, "--length-penalty", min=0.0),
    nbest: int = typer.Option(1, "--nbest", min=1, help="N best per line: LINE TAB SCORE TAB TEXT"),
    sample: bool = typer.Option(False, "--sample", help="draw each token instead of searching"),
    temperature: float = typer.Option(1.0, "--temperature", help="--sample: <1 sharper, >1 flatter"),
    topk: int = typer.Option(0, "--topk", min=0, help="--sample: the k likeliest tokens (0: all)"),
    topp: float = typer.Option(1.0, "--topp", help="--sample: the nucleus of this probability"),
    seed: Optional[int] = typer.Option(None, "--seed", help="--sample: repeatable draws"),
    prefix: Optional[str] = typer.Option(None, "--prefix", help="translations start with this"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
    precision: str = typer.Option("auto", "--precision", help="auto (GPU: the run's precision; "
                                  "CPU: fp32), fp32, bf16 or fp16"),
    print_alignment: bool = typer.Option(False, "--print-alignment", help="append TAB and "
                                         "source-target subword links (s-t, 0-based)"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Translate a file or stdin, one output line per input line (typed lines are answered one
    by one when stdin is a terminal).

    Example: mt translate runs/multi30k_de_en -i test.de -o test.en --beam 5
    """
    from mt import checkpoint
    from mt.outputs import is_stdio
    from mt.textio import check_input_output, interactive, read_input, write_output
    from mt.threads import choose_threads
    from mt.translator import Sampling, Translator
    _check_device(device)
    _check_beam(beam)
    sampling = Sampling.from_flags(sample, temperature, topk, topp, seed, beam, nbest)
    if print_alignment and (len(models) > 1 or nbest > 1 or sampling):
        raise MTError("--print-alignment works with one model and one translation per line")
    paths = [checkpoint.resolve(m) for m in models]
    check_input_output(input, output, force, paths)
    choose_threads(0, _err)
    translator = Translator.load(paths, device, precision)
    options = {"beam": 1 if greedy else beam, "length_penalty": length_penalty, "prefix": prefix}
    _err(translator.describe(paths, options, nbest, sampling))
    if is_stdio(input) and sys.stdin.isatty() and is_stdio(output) and not print_alignment \
            and nbest == 1:
        return interactive(translator, dict(options, sampling=sampling))
    write_output(output, translator.translate_lines(read_input(input), options, nbest,
                                                    sampling, print_alignment))


@command("eval")
def eval_cmd(
    models: Optional[List[Path]] = typer.Argument(None, help="run directories or checkpoints "
                                                  "that translate --src (several: compared)"),
    src: Optional[Path] = typer.Option(None, "--src", help="source file to translate"),
    ref: Path = typer.Option(..., "--ref", help="reference translations (raw text)"),
    hyps: Optional[List[Path]] = typer.Option(None, "--hyp", help="score this file instead of "
                                              "translating; repeat to compare systems"),
    beam: Optional[int] = typer.Option(None, "--beam", min=1),
    length_penalty: Optional[float] = typer.Option(None, "--length-penalty", min=0.0),
    ci: bool = typer.Option(False, "--ci", help="bootstrap 95% confidence intervals "
                                                "(1,000 resamples)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    device: str = typer.Option("auto", "--device"),
    precision: str = typer.Option("auto", "--precision", help="as for mt translate"),
    moses_lang: Optional[str] = typer.Option(
        None, "--lc-tok", help="also report lowercased Moses-tokenized BLEU for this target "
                               "language (the Multi30k papers' metric), e.g. --lc-tok en"),
):
    """Score with sacreBLEU (BLEU, chrF, chrF++, TER) against raw references, printing the
    signatures. Two or more systems (--hyp files or models) are compared with the first as
    the baseline: paired bootstrap resampling and approximate randomisation, with p-values.

    Examples: mt eval runs/multi30k_de_en --src test.de --ref test.en
              mt eval --hyp out.en --ref test.en --ci
              mt eval --hyp base.en --hyp new.en --ref test.en
    """
    from mt import evaluate
    _check_device(device)
    _check_beam(beam)
    systems = evaluate.systems(list(models or []), list(hyps or []), src, beam=beam,
                               length_penalty=length_penalty, device=device,
                               precision=precision)
    refs = evaluate.references(ref)
    if len(systems) == 1:
        result = evaluate.one_system(systems[0][1], refs, ci, moses_lang)
        typer.echo(json.dumps(result) if as_json else evaluate.describe_one(result, moses_lang))
    else:
        rows = evaluate.compare(systems, refs)
        typer.echo(json.dumps({"systems": rows}) if as_json else evaluate.describe_table(rows))


@command("attention")
def attention_cmd(
    model: Path = typer.Argument(..., help="run directory or checkpoint"),
    sentence: str = typer.Argument(..., help="the source sentence to translate"),
    output: Path = typer.Option(Path("attention.png"), "--output", "-o", help="PNG to write"),
    layer: Optional[int] = typer.Option(None, "--layer", min=1, help="one decoder layer (1-based); "
                                        "default: the mean over layers"),
    head: Optional[int] = typer.Option(None, "--head", min=1, help="one head (1-based); default: mean"),
    grid: bool = typer.Option(False, "--grid", help="one panel per layer and head"),
    beam: Optional[int] = typer.Option(None, "--beam", min=1),
    device: str = typer.Option("auto", "--device"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Translate one sentence and draw the cross-attention (source x output subwords).

    Example: mt attention runs/multi30k_de_en "Ein Hund rennt durch den Schnee." -o attn.png
    """
    from mt import checkpoint
    from mt.alignment import plot_attention
    from mt.outputs import check_output
    from mt.translator import Translator
    _check_device(device)
    _check_beam(beam)
    path = checkpoint.resolve(model)
    check_output(output, force=force, inputs=[path], what="picture")
    translator = Translator.from_checkpoint(path, device)
    text, weights, src_labels, tgt_labels = translator.attention(sentence, beam)
    n_layers, n_heads = weights.shape[:2]
    if layer is not None and layer > n_layers:
        raise MTError(f"--layer {layer}: the decoder has {n_layers} layers")
    if head is not None and head > n_heads:
        raise MTError(f"--head {head}: the model has {n_heads} heads")
    plot_attention(weights, src_labels, tgt_labels, output, layer, head, grid,
                   title=f"{sentence}\n-> {text}")
    typer.echo(text)
    typer.echo(f"wrote {output}")


@command("export")
def export_cmd(
    run: Path = typer.Argument(..., help="run directory (best.pt, else last.pt) or checkpoint"),
    to: str = typer.Option("ctranslate2", "--to", help="the format: ctranslate2"),
    out: Path = typer.Argument(..., help="folder to write the exported model into"),
    quantization: Optional[str] = typer.Option(None, "--quantization",
                                               help="int8, float16, ... (default: float32)"),
    force: bool = typer.Option(False, "--force", help="replace an earlier export in OUT"),
):
    """Export a Transformer run for a fast inference engine (CTranslate2).

    Example: mt export runs/multi30k_de_en ct2_de_en --quantization int8
    """
    from mt.export import export
    if to != "ctranslate2":
        raise MTError(f"--to {to!r}: the one format is ctranslate2")
    typer.echo(f"wrote {export(run, out, quantization, force)}")


@command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="run directory"),
    output: Path = typer.Option(..., "--output", "-o", help="the HTML page to write"),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="another run to compare "
                                            "with (significance on the test split)"),
    src: Optional[Path] = typer.Option(None, "--src", help="test source (default: the run's "
                                       "test split)"),
    ref: Optional[Path] = typer.Option(None, "--ref", help="test references"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """One self-contained HTML page about a run: config, curves, validation, tuning, test
    scores with confidence intervals, attention, best and worst translations, a baseline.

    Example: mt report runs/multi30k_de_en --baseline runs/rnn -o report.html
    """
    from mt.outputs import check_output, write_text
    from mt.report import build_report
    _check_device(device)
    if (src is None) != (ref is None):
        raise MTError("give both --src and --ref, or neither (the run's test split)")
    if not (run_dir / "train_log.jsonl").is_file():
        raise MTError(f"{run_dir} is not a run directory (no train_log.jsonl)")
    check_output(output, force=force, what="report")
    for path in (src, ref):
        if path is not None and not path.is_file():
            raise MTError(f"{path} not found")
    write_text(output, build_report(run_dir, baseline, src, ref, device))
    typer.echo(f"wrote {output}")


@command("average")
def average_cmd(
    run_dir: Path = typer.Argument(..., help="run directory holding step_N.pt snapshots"),
    last: int = typer.Option(5, "--last", min=1, help="average the last N snapshots"),
    output: Path = typer.Option(..., "--output", "-o", help="averaged checkpoint to write"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Average the weights of a run's last N checkpoints into one checkpoint.

    Example: mt average runs/multi30k_de_en --last 5 -o runs/multi30k_de_en/avg5.pt
    """
    from mt import checkpoint
    from mt.outputs import check_output
    if not run_dir.is_dir():
        raise MTError(f"{run_dir} is not a run directory; give the folder of an mt train run")
    paths = checkpoint.snapshots(run_dir)[-last:]
    if len(paths) < last:
        raise MTError(f"{run_dir} has {len(paths)} step_N.pt snapshot(s), fewer than --last {last}")
    check_output(output, force=force, inputs=paths, what="checkpoint")
    checkpoint.atomic_save(checkpoint.average(paths), output)
    typer.echo(f"averaged {', '.join(p.name for p in paths)} -> {output}")


def _number_list(text: str, cast, flag: str) -> list:
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MTError(f"{flag} {text!r}: give comma-separated numbers, e.g. {flag} 1,5,10")


@command("tune")
def tune_cmd(
    run_dir: Path = typer.Argument(..., help="run directory with best.pt"),
    beams: str = typer.Option("1,5,10", "--beams", help="beam sizes to try, comma-separated"),
    penalties: str = typer.Option("0.6,1.0,1.4", "--length-penalties",
                                  help="length penalties to try, comma-separated"),
    src: Optional[Path] = typer.Option(None, "--src", help="tuning source (default: the "
                                                           "run's valid split)"),
    ref: Optional[Path] = typer.Option(None, "--ref", help="tuning references"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
):
    """Choose beam size and length penalty on the valid split and store them in best.pt
    (what decode.tune_beams does at the end of `mt train`). Never tune on a test set.

    Example: mt tune runs/multi30k_de_en --beams 1,5,10 --length-penalties 0.6,1.0,1.4
    """
    from mt.tuning import tune_best, tuning_pairs
    if not (run_dir / "best.pt").is_file():
        raise MTError(f"{run_dir}/best.pt not found: tune a run directory that has validated")
    if (src is None) != (ref is None):
        raise MTError("give both --src and --ref, or neither (the run's valid split)")
    beam_list = _number_list(beams, int, "--beams")
    lp_list = _number_list(penalties, float, "--length-penalties")
    if not beam_list or min(beam_list) < 1 or not lp_list or min(lp_list) < 0:
        raise MTError("--beams needs sizes >= 1 and --length-penalties values >= 0")
    _check_beam(max(beam_list))
    src_lines, ref_lines = tuning_pairs(run_dir / "best.pt", src, ref)
    rec = tune_best(run_dir / "best.pt", src_lines, ref_lines, beam_list, lp_list, device)
    for g in rec["grid"]:
        typer.echo(f"beam {g['beam']:>3}  length penalty {g['length_penalty']:<4}  "
                   f"BLEU {g['valid_bleu']:.2f}")
    best = rec["tuned_decoding"]
    typer.echo(f"stored in {run_dir / 'best.pt'}: beam {best['beam']}, length penalty "
               f"{best['length_penalty']}")


@command("plot")
def plot_cmd(
    run_dir: Path = typer.Argument(..., help="run directory with train_log.jsonl"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="default RUN_DIR/training.png"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Draw the training curve (training/validation loss, validation BLEU) as a PNG.

    Example: mt plot runs/multi30k_de_en
    """
    from mt.outputs import check_folder_writable, check_output
    from mt.plot import plot_run
    if output is None:           # the run's own picture, redrawn as training redraws it
        if run_dir.is_dir():
            check_folder_writable(run_dir, "run")
    else:
        check_output(output, force=force, inputs=[run_dir / "train_log.jsonl"], what="picture")
    typer.echo(f"wrote {plot_run(run_dir, output)}")


def main() -> None:
    from mt.errors import Interrupted
    try:
        app()
    except Interrupted as e:
        _err(f"\n{e}")
        sys.exit(130)
    except KeyboardInterrupt:
        _err("\ninterrupted")
        sys.exit(130)
