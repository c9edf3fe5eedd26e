"""Corpus BLEU and chrF with sacrebleu on detokenized text against raw references."""
from __future__ import annotations

from dataclasses import dataclass

import sacrebleu

from mt.errors import MTError


@dataclass
class Scores:
    bleu: float
    chrf: float
    signature: str          # sacreBLEU's BLEU signature
    chrf_signature: str

    def to_dict(self) -> dict:
        return {"bleu": round(self.bleu, 2), "chrf": round(self.chrf, 2),
                "signature": self.signature, "chrf_signature": self.chrf_signature}


def _check_counts(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise MTError(f"{len(hyps)} hypotheses but {len(refs)} references: they must have the "
                      f"same number of lines")
    if not hyps:
        raise MTError("nothing to score: the hypotheses and references have no lines")


def moses_languages() -> list[str]:
    from sacremoses.corpus import NonbreakingPrefixes
    return sorted({code for code in NonbreakingPrefixes().available_langs.values()})


def check_moses_lang(lang: str) -> None:
    """sacremoses accepts any string and silently tokenizes unknown languages as English."""
    known = moses_languages()
    if lang not in known:
        raise MTError(f"--lc-tok {lang!r}: not a language the Moses tokenizer knows; use one of "
                      f"{', '.join(known)}")


def score(hyps: list[str], refs: list[str], lowercase: bool = False,
          tokenize: str | None = None) -> Scores:
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
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True)
            for line in lines]


def lc_tok_bleu(hyps: list[str], refs: list[str], lang: str) -> float:
    """Lowercased tokenized BLEU (multi-bleu.perl style), the number the Multi30k papers report."""
    _check_counts(hyps, refs)
    check_moses_lang(lang)
    bleu = sacrebleu.BLEU(tokenize="none", force=True)
    return bleu.corpus_score(moses_lc_tokenize(hyps, lang), [moses_lc_tokenize(refs, lang)]).score
