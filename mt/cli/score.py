"""`mt score`: how likely a model finds given translations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mt.cli.app import _check_device, _err, command
from mt.cli.flags import Device, Force, LengthPenalty, Precision, SrcLang, TgtLang
from mt.cli.use import AsJson, Inputs, OutputFile
from mt.errors import MTError

ScoreSource = Annotated[Path | None, typer.Option("--src", help="the sources (with --tgt)")]
ScoreTarget = Annotated[
    Path | None, typer.Option("--tgt", help="the translations to score, a line per source")
]
Pairs = Annotated[
    Path | None,
    typer.Option("-i", "--input", help="pairs, SOURCE TAB TRANSLATION a line (default stdin)"),
]


@command("score")
def score_cmd(
    models: Inputs,
    src: ScoreSource = None,
    tgt: ScoreTarget = None,
    input: Pairs = None,
    output: OutputFile = None,
    length_penalty: LengthPenalty = None,
    as_json: AsJson = False,
    src_lang: SrcLang = None,
    tgt_lang: TgtLang = None,
    device: Device = "auto",
    precision: Precision = "auto",
    force: Force = False,
):
    """Score given translations by teacher forcing: a line per pair, SCORE TAB LOGPROB TAB
    TOKENS TAB PERPLEXITY. LOGPROB sums the log-probabilities of the translation's subwords and
    its end of sentence (TOKENS of them); SCORE is LOGPROB / TOKENS^length-penalty, what beam
    search ranks by; PERPLEXITY is exp(-LOGPROB / TOKENS). Several models: their ensemble.

    \b
    Examples: mt score runs/de_en --src test.de --tgt hyp.en
              paste test.de hyp.en | mt score runs/a runs/b --json
    """
    from mt.artifacts import checkpoint
    from mt.cli.textio import check_input_output

    _check_device(device)
    if (src is None) != (tgt is None) or (src is not None and input is not None):
        raise MTError("give --src and --tgt, or -i with SOURCE TAB TRANSLATION lines, not both")
    paths = checkpoint.resolve_all(models)
    check_input_output(src or input, output, force, paths)
    if tgt is not None:
        check_input_output(tgt, None, force, [])
    sources, targets = _score_pairs(src, tgt, input)
    rows = _scores(paths, sources, targets, length_penalty, (src_lang, tgt_lang), device, precision)
    _write(output, rows, as_json)


def _scores(paths, sources, targets, length_penalty, langs, device, precision) -> list[dict]:
    """Each pair's score, log-probability, tokens and perplexity under the model(s)."""
    from mt.data.pairs import lead_token, tagged
    from mt.decode.scoring import score_pairs
    from mt.decode.translator import Translator

    translator = Translator.load(paths, device, precision)
    if translator.non_autoregressive:
        raise MTError("model.arch nat predicts all tokens at once: it gives no likelihood to score")
    lang = lead_token(translator.languages, langs[0], langs[1], _err)
    lp = translator.cfg.length_penalty if length_penalty is None else length_penalty
    return [
        {
            "score": s.normalised(lp),
            "logprob": s.logprob,
            "tokens": s.tokens,
            "perplexity": s.perplexity,
        }
        for s in score_pairs(translator, tagged(sources, lang), targets)
    ]


def _write(output: Path | None, rows: list[dict], as_json: bool) -> None:
    from mt.cli.textio import write_output

    lines = [json.dumps(r) if as_json else "\t".join(f"{v:.6g}" for v in r.values()) for r in rows]
    write_output(output, lines)


def _score_pairs(src: Path | None, tgt: Path | None, input: Path | None):
    """(sources, translations) of mt score: two files of as many lines, or TAB pairs."""
    from mt.cli.textio import read_input
    from mt.data.corpus import read_lines

    if src is not None and tgt is not None:
        sources, targets = read_lines(src), read_lines(tgt)
        if len(sources) != len(targets):
            raise MTError(f"--src has {len(sources)} lines but --tgt {len(targets)}: a line each")
        return sources, targets
    rows = [line.split("\t") for line in read_input(input)]
    for n, row in enumerate(rows, start=1):
        if len(row) != 2:
            raise MTError(
                f"line {n} of the pairs has {len(row) - 1} tabs: write SOURCE TAB TRANSLATION"
            )
    return [r[0] for r in rows], [r[1] for r in rows]
