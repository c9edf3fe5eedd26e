"""`mt translate`, `mt eval`, `mt attention`, `mt export`: using a trained model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from mt.cli.app import _check_beam, _check_device, _err, command
from mt.cli.flags import (
    Beam,
    Device,
    Force,
    LengthPenalty,
    NatIterations,
    NatLengthBeam,
    Precision,
    SrcLang,
    TgtLang,
)
from mt.errors import MTError

# the flags of translate and eval alone (mt/cli/flags.py: those several commands share)
Inputs = Annotated[
    list[Path],
    typer.Argument(
        help="run directory (best.pt, else last.pt) or checkpoint; several: an ensemble"
    ),
]
InputFile = Annotated[Path | None, typer.Option("-i", "--input", help="default stdin")]
OutputFile = Annotated[Path | None, typer.Option("-o", "--output", help="default stdout")]
Greedy = Annotated[bool, typer.Option("--greedy", help="greedy search (= --beam 1)")]
Nbest = Annotated[
    int, typer.Option("--nbest", min=1, help="N best per line: LINE TAB SCORE TAB TEXT")
]
Sample = Annotated[bool, typer.Option("--sample", help="draw each token instead of searching")]
Temperature = Annotated[
    float, typer.Option("--temperature", help="--sample: <1 sharper, >1 flatter")
]
TopK = Annotated[
    int, typer.Option("--topk", min=0, help="--sample: the k likeliest tokens (0: all)")
]
TopP = Annotated[float, typer.Option("--topp", help="--sample: the nucleus of this probability")]
Seed = Annotated[int | None, typer.Option("--seed", help="--sample: repeatable draws")]
Prefix = Annotated[str | None, typer.Option("--prefix", help="translations start with this")]
PrintAlignment = Annotated[
    bool,
    typer.Option(
        "--print-alignment", help="append TAB and source-target subword links (s-t, 0-based)"
    ),
]
Scored = Annotated[
    list[Path] | None,
    typer.Argument(help="run directories or checkpoints that translate --src (several: compared)"),
]
Source = Annotated[Path | None, typer.Option("--src", help="source file to translate")]
References = Annotated[
    list[Path],
    typer.Option(
        "--ref",
        help="reference translations (raw text); repeat for several references of the same "
        "lines (multi-reference BLEU, chrF and TER)",
    ),
]
Hypotheses = Annotated[
    list[Path] | None,
    typer.Option(
        "--hyp",
        help="score this file (- : standard input) instead of translating; repeat to compare "
        "systems",
    ),
]
Metrics = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        help="the metrics to report, comma-separated among bleu, chrf, chrf++, ter (default: "
        "all; one system)",
    ),
]
Intervals = Annotated[
    bool, typer.Option("--ci", help="bootstrap 95% confidence intervals (1,000 resamples)")
]
AsJson = Annotated[bool, typer.Option("--json", help="print one JSON object")]
LcTok = Annotated[
    str | None,
    typer.Option(
        "--lc-tok",
        help="also report lowercased Moses-tokenized BLEU for this target language (the "
        "Multi30k papers' metric), e.g. --lc-tok en",
    ),
]


@command("translate")
def translate_cmd(
    models: Inputs,
    input: InputFile = None,
    output: OutputFile = None,
    beam: Beam = None,
    greedy: Greedy = False,
    length_penalty: LengthPenalty = None,
    nbest: Nbest = 1,
    nat_iterations: NatIterations = None,
    nat_length_beam: NatLengthBeam = None,
    sample: Sample = False,
    temperature: Temperature = 1.0,
    topk: TopK = 0,
    topp: TopP = 1.0,
    seed: Seed = None,
    prefix: Prefix = None,
    src_lang: SrcLang = None,
    tgt_lang: TgtLang = None,
    device: Device = "auto",
    precision: Precision = "auto",
    print_alignment: PrintAlignment = False,
    force: Force = False,
):
    """Translate a file or stdin, one output line per input line (typed lines are answered one
    by one when stdin is a terminal).

    Example: mt translate runs/multi30k_de_en -i test.de -o test.en --beam 5
    """
    from mt.decode.sampling import Sampling

    _check_device(device)
    _check_beam(beam)
    if greedy and beam not in (None, 1):
        raise MTError(f"--greedy is --beam 1, and --beam {beam} was given too: give one of them")
    sampling = Sampling.from_flags(sample, temperature, topk, topp, seed, beam, nbest)
    if print_alignment and (len(models) > 1 or nbest > 1 or sampling):
        raise MTError("--print-alignment works with one model and one translation per line")
    given = {
        "beam": 1 if greedy else beam,
        "length_penalty": length_penalty,
        "nat_iterations": nat_iterations,
        "nat_length_beam": nat_length_beam,
    }
    more = {"nbest": nbest, "sampling": sampling, "prefix": prefix}
    langs = (src_lang, tgt_lang)
    _translate(models, input, output, force, device, precision, given, more, print_alignment, langs)


def _translate(models, input, output, force, device, precision, given, more, alignment, langs):
    """mt translate once its flags are checked: given, the settings a run decides unless a
    flag gives them; more, the other options; langs: --src-lang and --tgt-lang."""
    from mt.artifacts import checkpoint
    from mt.cli.textio import (
        check_input_output,
        interactive,
        output_lines,
        read_input,
        write_output,
    )
    from mt.data.pairs import lead_token, tagged
    from mt.decode.options import OptionError
    from mt.decode.translator import Translator
    from mt.outputs import is_stdio
    from mt.runtime.threads import choose_threads

    paths = checkpoint.resolve_all(models)
    check_input_output(input, output, force, paths)
    choose_threads(0, _err)
    translator = Translator.load(paths, device, precision)
    translator.check_applies(**given)
    lang = lead_token(translator.languages, *langs, _err)
    try:
        opts = translator.options(**given, **more)
    except OptionError as e:
        raise e.as_flag() from None
    _err(translator.describe(paths, opts) + (f", into {lang}" if lang else ""))
    typed = is_stdio(input) and sys.stdin.isatty() and is_stdio(output)
    if typed and not alignment and more["nbest"] == 1:
        return interactive(translator, opts, lang)
    lines = tagged(read_input(input), lang)
    write_output(output, output_lines(translator, lines, opts, alignment))


@command("eval")
def eval_cmd(
    ref: References,
    models: Scored = None,
    src: Source = None,
    hyps: Hypotheses = None,
    beam: Beam = None,
    length_penalty: LengthPenalty = None,
    nat_iterations: NatIterations = None,
    nat_length_beam: NatLengthBeam = None,
    ci: Intervals = False,
    as_json: AsJson = False,
    src_lang: SrcLang = None,
    tgt_lang: TgtLang = None,
    device: Device = "auto",
    precision: Precision = "auto",
    moses_lang: LcTok = None,
    metrics: Metrics = None,
):
    """Score with sacreBLEU (BLEU, chrF, chrF++, TER) against raw references, printing the
    signatures. Two or more systems (--hyp files or models) are compared with the first as
    the baseline: paired bootstrap resampling and approximate randomisation, with p-values.

    \b
    Examples: mt eval runs/multi30k_de_en --src test.de --ref test.en
              mt eval --hyp out.en --ref test.en --ci
              mt translate runs/multi30k_de_en -i test.de | mt eval --hyp - --ref test.en
              mt eval --hyp base.en --hyp new.en --ref test.en
    """
    from mt.cli.textio import read_input
    from mt.evaluate import compare
    from mt.evaluate.metrics import check_moses_lang

    _check_device(device)
    _check_beam(beam)
    chosen = compare.metrics_of(metrics, len(hyps or []) + len(models or []))
    if moses_lang:
        check_moses_lang(moses_lang)  # before any translating
    settings = {
        "beam": beam,
        "length_penalty": length_penalty,
        "device": device,
        "nat_iterations": nat_iterations,
        "nat_length_beam": nat_length_beam,
        "precision": precision,
    }
    systems = compare.systems(
        list(models or []), list(hyps or []), src, (src_lang, tgt_lang), read_input, **settings
    )
    _report(systems, ref, ci, moses_lang, as_json, chosen)


def _report(systems, ref: list[Path], ci: bool, moses_lang, as_json: bool, chosen) -> None:
    """mt eval's scores: one system's (the metrics `chosen`), or a table of several against
    the first."""
    from mt.evaluate import compare
    from mt.evaluate.metrics import paired_significance

    refs = compare.references(ref)
    for name in compare.same_as_references(systems, refs):
        _err(
            f"note: {name} is a reference line for line (--hyp given a --ref file?): its "
            f"scores say nothing of a model"
        )
    if len(systems) == 1:
        result = compare.one_system(systems[0][1], refs, ci, moses_lang, chosen)
        if as_json:  # (the files' names, which a model card shows as the test set's)
            typer.echo(json.dumps({**result, "references": [p.name for p in ref]}))
        else:
            typer.echo(compare.describe_one(result, moses_lang))
    else:
        rows = paired_significance(systems, refs)
        typer.echo(json.dumps({"systems": rows}) if as_json else compare.describe_table(rows))


@command("attention")
def attention_cmd(
    model: Path = typer.Argument(..., help="run directory or checkpoint"),
    sentence: str = typer.Argument(..., help="the source sentence to translate"),
    output: Path = typer.Option(
        Path("attention.png"), "--output", "-o", help="picture to write: .png, .svg, .pdf, ..."
    ),
    layer: int | None = typer.Option(
        None,
        "--layer",
        min=1,
        max=1 << 10,
        help="one decoder layer (1-based); default: the mean over layers",
    ),
    head: int | None = typer.Option(
        None, "--head", min=1, max=1 << 10, help="one head (1-based); default: mean"
    ),
    grid: bool = typer.Option(False, "--grid", help="one panel per layer and head"),
    beam: int | None = typer.Option(None, "--beam", min=1),
    device: str = typer.Option("auto", "--device"),
    force: bool = typer.Option(False, "--force", help="overwrite --output if it exists"),
):
    """Translate one sentence and draw the cross-attention (source x output subwords).

    Example: mt attention runs/multi30k_de_en "Ein Hund rennt durch den Schnee." -o attn.png
    """
    from mt.artifacts import checkpoint
    from mt.decode.alignment import plot_attention
    from mt.decode.translator import Translator
    from mt.outputs import check_output, picture_format

    _check_device(device)
    _check_beam(beam)
    picture_format(output)  # (before any work: out.txt is refused, out.svg is an SVG)
    path = checkpoint.resolve(model, "mt attention")
    check_output(output, force=force, inputs=[path], what="picture")
    translator = Translator.from_checkpoint(path, device)
    text, weights, src_labels, tgt_labels = translator.attention(sentence, beam)
    n_layers, n_heads = weights.shape[:2]
    if layer is not None and layer > n_layers:
        raise MTError(f"--layer {layer}: the decoder has {n_layers} layers")
    if head is not None and head > n_heads:
        raise MTError(f"--head {head}: the model has {n_heads} heads")
    plot_attention(
        weights, src_labels, tgt_labels, output, layer, head, grid, title=f"{sentence}\n-> {text}"
    )
    typer.echo(text)
    typer.echo(f"wrote {output}")


@command("export")
def export_cmd(
    run: Path = typer.Argument(..., help="run directory (best.pt, else last.pt) or checkpoint"),
    to: str = typer.Option(
        "ctranslate2", "--format", "--to", help="ctranslate2 (fast inference) or transformers"
    ),
    out: Path = typer.Argument(..., help="folder to write the exported model into"),
    quantization: str | None = typer.Option(
        None, "--quantization", help="ctranslate2: int8, float16, ... (default: float32)"
    ),
    scores: Path | None = typer.Option(
        None,
        "--scores",
        help="transformers: the JSON of mt eval --json on a test set, for the model card",
    ),
    force: bool = typer.Option(False, "--force", help="replace an earlier export in OUT"),
    license_id: str | None = typer.Option(
        None,
        "--license",
        help="transformers: the model card's license (a hub license id, e.g. cc-by-4.0), "
        "which the training data's terms decide; default: unknown",
    ),
):
    """Export a Transformer run for a fast inference engine (CTranslate2) or as a transformers
    Marian model (a folder from_pretrained loads, with a model card, ready to upload).

    Examples: mt export runs/multi30k_de_en ct2_de_en --quantization int8;
    mt export runs/multi30k_de_en opus-de-en --format transformers --scores test.json
    """
    if to == "transformers":
        from mt.hub.export import export as to_transformers

        if quantization is not None:
            raise MTError(
                "--quantization applies to --format ctranslate2; a transformers model is "
                "saved in float32 (quantize it with transformers' own tools)"
            )
        typer.echo(f"wrote {to_transformers(run, out, scores, force, license_id or 'unknown')}")
        return
    if to != "ctranslate2":
        raise MTError(f"--format {to!r}: use ctranslate2 or transformers")
    if scores is not None or license_id is not None:
        raise MTError("--scores and --license apply to --format transformers (its model card)")
    from mt.artifacts.export import export

    typer.echo(f"wrote {export(run, out, quantization, force)}")
