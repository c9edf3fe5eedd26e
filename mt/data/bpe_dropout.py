"""BPE-dropout as its paper defines it (Provilkov et al., ACL 2020, Algorithm 1), on the merges
of a sentencepiece BPE model: each word is built up from its characters, the model's merges
taken in the model's order (a piece's score), and at every step each merge that applies is
left out with probability p; a word all of whose merges are left out at one step stays as it
is. With p = 0 it is the model's own segmentation.

sentencepiece's own sampling for BPE (`enable_sampling` with `alpha` = p) is another process: a
merge it skips once is never tried again, so it breaks words up about twice as often (at
p = 0.1, Multi30k's German is 41% longer in pieces against the paper's 20%; the figures are in
docs/multi30k_recipe.md).

One generator for the process, as sentencepiece has: seed it (seed_dropout) before each
epoch's encoding, and every rank and a resumed run segment that epoch the same way."""

from __future__ import annotations

import random

import sentencepiece as spm

_GENERATOR = random.Random(0)


def seed_dropout(seed: int) -> None:
    _GENERATOR.seed(seed)


class MergeDropout:
    """A BPE model's merges, ranked: `scores[piece]` is the score of a piece that two
    symbols can be merged into (the higher, the earlier the merge)."""

    def __init__(self, sp: spm.SentencePieceProcessor):
        self.sp = sp
        self.scores = {
            sp.IdToPiece(i): sp.GetScore(i)
            for i in range(sp.GetPieceSize())
            if not (sp.IsControl(i) or sp.IsUnknown(i) or sp.IsByte(i))
        }

    def encode(self, lines: list[str], p: float) -> list[list[str]]:
        """Each line's pieces, its words merged anew with dropout p. The words' characters
        are sentencepiece's own, every merge left out (alpha 1: its normalisation, and its
        reserved symbols whole); a symbol of several characters there is one that is never
        merged."""
        out = []
        chars = self.sp.Encode(lines, out_type=str, enable_sampling=True, alpha=1.0, nbest_size=-1)
        for symbols in chars:
            pieces: list[str] = []
            word: list[str] = []
            for symbol in symbols:
                if len(symbol) > 1:  # a reserved symbol: as it is
                    pieces += [*self.merged(word, p), symbol]
                    word = []
                elif symbol == "\u2581":  # a new word
                    pieces += self.merged(word, p)
                    word = [symbol]
                else:
                    word.append(symbol)
            out.append(pieces + self.merged(word, p))
        return out

    def merged(self, symbols: list[str], p: float) -> list[str]:
        """Algorithm 1: until no merge is left in a step, keep each merge that applies with
        probability 1 - p and apply the best kept one (the leftmost among equals, as
        sentencepiece does)."""
        symbols, scores, draw = list(symbols), self.scores, _GENERATOR.random
        while len(symbols) > 1:
            best, at = None, -1
            for i in range(len(symbols) - 1):
                score = scores.get(symbols[i] + symbols[i + 1])
                if score is None or (p > 0 and draw() < p):
                    continue
                if best is None or score > best:
                    best, at = score, i
            if best is None:
                break
            symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
        return symbols
