"""Corpus BLEU, chrF, chrF++ and TER with sacreBLEU on detokenized text against raw
references; bootstrap confidence intervals and paired significance tests between systems."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sacrebleu

from mt.errors import MTError


@dataclass
class Scores:
    bleu: float
    chrf: float
    signature: str  # sacreBLEU's BLEU signature
    chrf_signature: str


def streams(refs: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    """References as sacreBLEU takes them: a list of streams (one per reference
    translation), each a line per hypothesis; one stream may be given as a list of lines."""
    if refs and isinstance(refs[0], str):
        return [list(refs)]  # type: ignore[arg-type]
    return [list(r) for r in refs]


def _check_counts(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> None:
    for stream in streams(refs) or [[]]:
        if len(hyps) != len(stream):
            raise MTError(
                f"{len(hyps)} hypotheses but {len(stream)} references: they must have the "
                f"same number of lines"
            )
    if not hyps:
        raise MTError("nothing to score: the hypotheses and references have no lines")


def check_moses_lang(lang: str) -> None:
    """sacremoses accepts any string and silently tokenizes unknown languages as English."""
    from mt.data.textform import moses_languages

    known = moses_languages()
    if lang not in known:
        raise MTError(
            f"--lc-tok {lang!r}: not a language the Moses tokenizer knows; use one of "
            f"{', '.join(known)}"
        )


def score(
    hyps: list[str], refs: list[str], lowercase: bool = False, tokenize: str | None = None
) -> Scores:
    _check_counts(hyps, refs)
    bleu = sacrebleu.BLEU(lowercase=lowercase, tokenize=tokenize)
    chrf = sacrebleu.CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    return Scores(b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()))


def moses_lc_tokenize(lines: list[str], lang: str) -> list[str]:
    """Multi30k's official task1-tokenize.sh: lowercase, normalize-punctuation.perl -l LANG,
    tokenizer.perl -l LANG (with its default HTML escaping), here through sacremoses."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True)
        for line in lines
    ]


def lc_tok_bleu(hyps: list[str], refs, lang: str) -> float:
    """Lowercased tokenized BLEU (multi-bleu.perl style), the number the Multi30k papers report.
    refs: one stream of lines, or several (streams)."""
    _check_counts(hyps, refs)
    check_moses_lang(lang)
    bleu = sacrebleu.BLEU(tokenize="none", force=True)
    tokenized = [moses_lc_tokenize(r, lang) for r in streams(refs)]
    return bleu.corpus_score(moses_lc_tokenize(hyps, lang), tokenized).score


class _CHRF(sacrebleu.CHRF):
    """sacreBLEU's chrF, its scores always Python floats: where some sentences match nothing
    its bootstrap mixes float and numpy.float32 scores, which statistics.mean refuses (a
    TypeError on outputs of mostly empty lines). The numbers are sacreBLEU's own."""

    def _compute_score_from_stats(self, stats):
        score = super()._compute_score_from_stats(stats)
        score.score = float(score.score)
        return score


def pair_scores(
    hyps: list[str], refs: list[str], pairs: tuple = (), best_by: str = "mean"
) -> tuple[float, float, dict[str, float]]:
    """(BLEU, chrF, each pair's BLEU) of translations of several language pairs' lines, held
    one pair after another (pairs: ((name, lines), ...) in that order; data.pairs): each pair
    scored on its own, the BLEU best_by's (their mean, or one pair's) and the chrF their mean.
    No pairs: the corpus's scores, and {}."""
    if not pairs:
        s = score(hyps, refs)
        return s.bleu, s.chrf, {}
    by_pair, chrfs, start = {}, [], 0
    for name, n in pairs:
        s = score(hyps[start : start + n], refs[start : start + n])
        by_pair[name], start = s.bleu, start + n
        chrfs.append(s.chrf)
    bleu = sum(by_pair.values()) / len(by_pair) if best_by == "mean" else by_pair[best_by]
    return bleu, sum(chrfs) / len(chrfs), by_pair


# what `mt eval --metrics` chooses from: the name a user gives -> the result's key
METRICS = {"bleu": "bleu", "chrf": "chrf", "chrf++": "chrf_pp", "ter": "ter"}


def full_scores(
    hyps: list[str], refs, n_bootstrap: int = 0, chosen: tuple[str, ...] = tuple(METRICS)
) -> dict:
    """What `mt eval` reports: BLEU, chrF, chrF++ (word bigrams too, Popović 2017) and TER
    (or those `chosen`, METRICS' names), each with its sacreBLEU signature; with n_bootstrap
    > 1 also each one's bootstrap mean and 95% confidence half-width (Koehn 2004), as
    "<metric>_mean" and "<metric>_ci". refs: one stream of lines, or several
    (multi-reference scores: the signatures say nrefs)."""
    _check_counts(hyps, refs)
    out = {}
    metrics: dict[str, Callable[[], Any]] = {
        "bleu": sacrebleu.BLEU,
        "chrf": _CHRF,
        "chrf_pp": lambda: _CHRF(word_order=2),
        "ter": sacrebleu.TER,
    }
    keys = {METRICS[c] for c in chosen}
    for name, metric in ((n, make()) for n, make in metrics.items() if n in keys):
        s = metric.corpus_score(hyps, streams(refs), n_bootstrap=max(n_bootstrap, 1))
        out[name] = round(s.score, 2)
        out[f"{name}_signature"] = str(metric.get_signature())
        if n_bootstrap > 1:
            out[f"{name}_mean"], out[f"{name}_ci"] = _round(s._mean), _round(s._ci)
    return out


def paired_significance(
    systems: list[tuple[str, Sequence[str]]],
    refs: Sequence[str] | Sequence[Sequence[str]],
    n_bootstrap: int = 1000,
    n_trials: int = 10000,
) -> list[dict[str, Any]]:
    """Each system against the first (the baseline) on BLEU and chrF: sacreBLEU's paired
    bootstrap resampling (Koehn 2004; its mean, 95% CI and p-value) and approximate
    randomisation (Riezler & Maxwell 2005; its p-value). One row per system, baseline first."""
    from sacrebleu.significance import PairedTest

    ref_streams = streams(refs)
    for name, hyps in systems:
        if any(len(hyps) != len(r) for r in ref_streams):
            raise MTError(
                f"{name}: {len(hyps)} lines but the references have {len(ref_streams[0])}"
            )
    if not ref_streams or not ref_streams[0]:
        raise MTError("nothing to score: the hypotheses and references have no lines")
    rows: list[dict[str, Any]] = [{"system": name} for name, _ in systems]
    for test, n in (("bs", n_bootstrap), ("ar", n_trials)):
        metrics = {"BLEU": sacrebleu.BLEU(), "chrF": _CHRF()}
        _, results = PairedTest(systems, metrics, ref_streams, test_type=test, n_samples=n)()
        for metric, key in (("BLEU", "bleu"), ("chrF2", "chrf")):
            scored: list[Any] = list(results[metric])  # sacrebleu Results, one per system
            for row, r in zip(rows, scored, strict=True):
                row[key] = round(r.score, 2)
                if test == "bs":
                    row[f"{key}_mean"], row[f"{key}_ci"] = _round(r.mean), _round(r.ci)
                row[f"{key}_p_{test}"] = _round(r.p_value, 4)
    # sacreBLEU (after MultEval) does not count a zero difference as chance, so an output
    # identical to the baseline's would get the smallest p-value: it is p = 1, no difference
    for row, (_, hyps) in zip(rows[1:], systems[1:], strict=True):
        if hyps == systems[0][1]:
            row.update({k: 1.0 for k in row if "_p_" in k})
            row["same_as_baseline"] = True
    return rows


def _round(x, digits: int = 2):
    return None if x is None else round(float(x), digits)
