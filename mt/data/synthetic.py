"""A synthetic translation task with a known answer, for smoke tests and demos.

The source language has a random lexicon of made-up words; the target maps each word through a
fixed dictionary and puts every adjective after its noun (a local reordering, as German->English
sometimes needs). A correct model scores BLEU 100 on held-out sentences.
"""

from __future__ import annotations

import random

_SYLLABLES = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "pe", "zu", "da", "fo"]


def _lexicon(rng: random.Random, n: int, syllables: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(syllables)))
    return sorted(words)


def generate(n_pairs: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    lex = random.Random(12345)  # the language itself is fixed; only sentences vary with seed
    nouns, adjs, verbs = _lexicon(lex, 24, 2), _lexicon(lex, 10, 3), _lexicon(lex, 10, 3)
    out_words = _lexicon(lex, 44, 2)
    lex.shuffle(out_words)
    translate = dict(zip(nouns + adjs + verbs, [w.upper() for w in out_words], strict=True))
    src, tgt = [], []
    for _ in range(n_pairs):
        s_words, t_words = [], []
        for slot in range(rng.randint(2, 4)):
            if slot == 1:
                verb = rng.choice(verbs)
                s_words.append(verb)
                t_words.append(translate[verb])
            noun = rng.choice(nouns)
            if rng.random() < 0.5:
                adj = rng.choice(adjs)
                s_words += [adj, noun]
                t_words += [translate[noun], translate[adj]]
            else:
                s_words.append(noun)
                t_words.append(translate[noun])
        src.append(" ".join(s_words))
        tgt.append(" ".join(t_words))
    return src, tgt


def splits(
    train: int = 6000, valid: int = 200, test: int = 200, seed: int = 0
) -> dict[str, tuple[list[str], list[str]]]:
    src, tgt = generate(train + valid + test, seed)
    cut = {
        "train": (0, train),
        "valid": (train, train + valid),
        "test": (train + valid, train + valid + test),
    }
    return {name: (src[a:b], tgt[a:b]) for name, (a, b) in cut.items()}
