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


def score(hyps: list[str], refs: list[str], lowercase: bool = False,
          tokenize: str | None = None) -> Scores:
    if len(hyps) != len(refs):
        raise MTError(f"{len(hyps)} hypotheses but {len(refs)} references: they must have the "
                      f"same number of lines")
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
    if len(hyps) != len(refs):
        raise MTError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu = sacrebleu.BLEU(tokenize="none", force=True)
    return bleu.corpus_score(moses_lc_tokenize(hyps, lang), [moses_lc_tokenize(refs, lang)]).score
