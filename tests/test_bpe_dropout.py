"""BPE-dropout (mt/data/bpe_dropout.py) is the paper's Algorithm 1 on a sentencepiece model's
merges: with p = 0 the model's own segmentation, with p = 1 characters, and in between the
distribution of segmentations that Algorithm 1, written out here, draws."""

import collections
import itertools
import random

import pytest
import sentencepiece as spm

from mt.data.bpe_dropout import MergeDropout, seed_dropout
from mt.data.tokenizer import train_bpe

WORDS = [
    "Männer",
    "spielen",
    "Straße",
    "Frauen",
    "Hund",
    "rennt",
    "durch",
    "den",
    "Schnee",
    "ein",
    "eine",
    "Kinder",
    "sitzen",
    "auf",
    "einer",
    "Bank",
    "vor",
    "dem",
    "Haus",
    "Mann",
    "Frau",
    "mit",
    "roten",
    "Hemd",
    "läuft",
    "über",
    "die",
    "grüne",
    "Wiese",
]


@pytest.fixture(scope="module")
def model():
    rng = random.Random(0)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) for _ in range(3000)]
    sp = spm.SentencePieceProcessor(model_proto=train_bpe(lines, 300, 1.0, 10**6, 1, (">>fr<<",)))
    return sp, lines


def test_without_dropout_it_is_the_models_own_segmentation(model):
    sp, lines = model
    odd = ["Ein Mann ☃ mit ∰∰ Hemd", ">>fr<< Männer spielen", "  zwei   Leerzeichen ", "", "Ä"]
    for text in lines[:500] + odd:
        assert MergeDropout(sp).encode([text], 0.0) == sp.Encode([text], out_type=str), text


def test_full_dropout_leaves_characters_and_reserved_symbols_whole(model):
    sp, _ = model
    (pieces,) = MergeDropout(sp).encode([">>fr<< Männer spielen"], 1.0)
    assert pieces == ["▁", ">>fr<<", *"▁Männer", *"▁spielen"]


def test_a_segmentation_spells_the_same_text_and_a_seed_repeats_it(model):
    sp, lines = model
    merges = MergeDropout(sp)
    seed_dropout(5)
    first = merges.encode(lines[:300], 0.1)
    seed_dropout(5)
    assert merges.encode(lines[:300], 0.1) == first
    assert merges.encode(lines[:300], 0.1) != first  # (the next draw)
    plain = sp.Encode(lines[:300], out_type=str)
    assert ["".join(x) for x in first] == ["".join(x) for x in plain]
    assert sum(map(len, first)) > sum(map(len, plain))
    assert sp.Encode(lines[:300], out_type=str) == plain  # (no dropout left switched on)


def _algorithm_1(word: str, scores: dict, p: float, rng: random.Random) -> tuple[str, ...]:
    """Provilkov et al. (2020), Algorithm 1, for one word: at each step every applicable merge
    is dropped with probability p; stop when none is left, else apply the highest-priority
    one (the leftmost among equals)."""
    symbols = list(word)
    while True:
        kept = [
            (scores[a + b], -i)
            for i, (a, b) in enumerate(itertools.pairwise(symbols))
            if a + b in scores and rng.random() >= p
        ]
        if not kept:
            return tuple(symbols)
        i = -max(kept)[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


def _distance(a: collections.Counter, b: collections.Counter, n: int) -> float:
    return sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / 2 / n


def test_dropout_draws_the_segmentations_algorithm_1_draws(model):
    """The paper redraws every merge at every step, where sentencepiece's own sampling drops
    a merge it skipped once for good (and so breaks words up far more often): the test tells
    the two apart (total variation 0.15-0.2 at p = 0.1, against 0.01-0.03 between two samples
    of one process)."""
    sp, _ = model
    merges, n, p = MergeDropout(sp), 4000, 0.1
    rng = random.Random(1)
    seed_dropout(2)
    spm.set_random_generator_seed(3)
    for word in ("Männer", "spielen", "Straße", "Frauen"):
        ours = collections.Counter(tuple(x) for x in merges.encode([word] * n, p))
        paper = collections.Counter(
            _algorithm_1("▁" + word, merges.scores, p, rng) for _ in range(n)
        )
        skipped_for_good = collections.Counter(
            tuple(x)
            for x in sp.Encode(
                [word] * n, out_type=str, enable_sampling=True, alpha=p, nbest_size=-1
            )
        )
        assert _distance(ours, paper, n) < 0.06, word
        assert _distance(skipped_for_good, paper, n) > 0.1, word  # (the test can tell)
