"""`mt eval`: the systems to score (hypothesis files, or models translating a source file),
one system's scores and the table of several compared against the first."""

from __future__ import annotations

import sys
from pathlib import Path

from mt.data.corpus import read_lines
from mt.errors import MTError
from mt.evaluate.metrics import METRICS, full_scores, lc_tok_bleu


def systems(
    models: list[Path],
    hyps: list[Path],
    src: Path | None,
    langs: tuple[str | None, str | None] = (None, None),
    read=read_lines,
    **decode,
) -> list:
    """[(name, hypotheses)] in the order given: hypothesis files (each read by `read`), or
    each model's translation of `src` (decode: beam, length_penalty, nat_iterations,
    nat_length_beam, device, precision; langs: --src-lang and --tgt-lang, for a model of
    several pairs)."""
    if sum(str(h) == "-" for h in hyps) > 1:
        raise MTError("--hyp - reads standard input, which holds one system: give it once")
    if hyps and models:
        raise MTError("give --hyp files or models with --src, not both")
    if hyps and any(langs):
        raise MTError(
            "--src-lang and --tgt-lang choose a model's direction: with --hyp files "
            "there is none to choose; leave them out"
        )
    if hyps:
        return [(str(h), read(h)) for h in hyps]
    if not models or src is None:
        raise MTError("nothing to score: pass --hyp FILE, or a model and --src FILE")
    from mt.data.pairs import lead_token, tagged
    from mt.decode.translator import Translator

    lines = read_lines(src)
    device, precision = decode.pop("device"), decode.pop("precision")
    out = []
    for m in models:
        t = Translator.load(m, device, precision)
        t.check_applies(**decode)
        tag = lead_token(t.languages, *langs, lambda said: print(said, file=sys.stderr))
        out.append((str(m), t.translate(tagged(lines, tag), **decode)))
    return out


def references(paths: list[Path]) -> list[list[str]]:
    """The lines of each --ref file: several references translate the same lines (sacreBLEU's
    multi-reference scores), so their lengths must agree."""
    refs = [read_lines(p) for p in paths]
    for path, lines in zip(paths[1:], refs[1:], strict=True):
        if len(lines) != len(refs[0]):
            raise MTError(
                f"--ref {path} has {len(lines)} lines but --ref {paths[0]} has {len(refs[0])}: "
                f"several references must translate the same lines"
            )
    return refs


def one_system(
    hyps: list[str], refs: list[list[str]], ci: bool, moses_lang: str | None, chosen=METRICS
) -> dict:
    """refs: one stream of lines per reference file; chosen: the metrics (METRICS' names)."""
    result = full_scores(hyps, refs, n_bootstrap=1000 if ci else 0, chosen=tuple(chosen))
    if moses_lang:
        result["bleu_lc_tok"] = round(lc_tok_bleu(hyps, refs, moses_lang), 2)
    return result


def describe_one(r: dict, moses_lang: str | None) -> str:
    lines = []
    for key, label in (("bleu", "BLEU"), ("chrf", "chrF"), ("chrf_pp", "chrF++"), ("ter", "TER")):
        if key not in r:
            continue
        spread = (
            f"  (bootstrap mean {r[key + '_mean']:.2f} ± {r[key + '_ci']:.2f})"
            if key + "_ci" in r
            else ""
        )
        lines.append(f"{label} = {r[key]:.2f}{spread}  ({r[key + '_signature']})")
    if moses_lang:
        lines.append(f"BLEU (lowercased, Moses-tokenized, {moses_lang}) = {r['bleu_lc_tok']:.2f}")
    return "\n".join(lines)


def describe_table(rows: list[dict]) -> str:
    """The systems with BLEU and chrF (bootstrap mean ± 95% CI) and the p-values of both tests
    against the baseline (the first row)."""
    width = max(len(r["system"]) for r in rows) + 2
    head = (
        f"{'system':<{width}}{'BLEU':>7}{'mean ± CI':>16}{'p (bs)':>9}{'p (ar)':>9}"
        f"{'chrF':>8}{'mean ± CI':>16}{'p (bs)':>9}{'p (ar)':>9}"
    )
    out = [head]
    for i, r in enumerate(rows):
        cells = [f"{r['system']:<{width}}"]
        for m in ("bleu", "chrf"):
            if i == 0:
                p_bs, p_ar = "baseline", ""
            else:
                p_bs, p_ar = f"{r[m + '_p_bs']:.4f}", f"{r[m + '_p_ar']:.4f}"
            cells.append(
                f"{r[m]:>{7 if m == 'bleu' else 8}.2f}"
                f"{r[m + '_mean']:>9.2f} ± {r[m + '_ci']:<4.2f}{p_bs:>9}{p_ar:>9}"
            )
        out.append("".join(cells))
    if any(r.get("same_as_baseline") for r in rows):
        out.append("(an output identical to the baseline's: p = 1, nothing differs)")
    out.append(
        "p: the probability of a difference at least this large by chance (paired "
        "bootstrap, 1,000 resamples; approximate randomisation, 10,000 trials)"
    )
    return "\n".join(out)


def metrics_of(text: str | None, systems: int = 1) -> tuple[str, ...]:
    """--metrics: a comma-separated choice among METRICS' names (None: all of them), for one
    of the `systems` (a comparison of several reports BLEU and chrF)."""
    if text is None:
        return tuple(METRICS)
    if systems > 1:
        raise MTError(
            "--metrics chooses one system's scores; a comparison of several reports BLEU "
            "and chrF: leave it out"
        )
    chosen = tuple(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    unknown = [m for m in chosen if m not in METRICS]
    if unknown or not chosen:
        raise MTError(
            f"--metrics {text!r}: choose among {', '.join(METRICS)}, comma-separated "
            f"(e.g. --metrics bleu,chrf)"
        )
    return chosen


def same_as_references(systems: list, refs: list[list[str]]) -> list[str]:
    """The systems whose hypotheses are a reference line for line (a score of 100 that says
    nothing of a model: --hyp given the --ref file, say)."""
    return [name for name, hyps in systems if any(hyps == r for r in refs)]
