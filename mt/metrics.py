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
