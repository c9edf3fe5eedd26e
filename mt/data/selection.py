"""Which training pairs a run reads, beyond cleaning: its corpora (each pair's, then
data.corpora's with their weights, a back-translated one tagged), the pairs dropped on request
(duplicates, a length ratio), and a uniform sample of them (what the BPE model learns from),
with the pieces that model reserves."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator

from mt.config import Config
from mt.config.data import CorpusConfig
from mt.data.corpus import Stats
from mt.data.pairs import Languages, Pair, tag
from mt.errors import MTError
from mt.tokens import BT_TAG


def train_parts(cfg: Config) -> list[tuple[Pair, CorpusConfig | None]]:
    """What the training split is read from: each pair's corpus, then data.corpora's (the
    one pair's)."""
    pairs = Languages.of(cfg.data).pairs
    return [(p, None) for p in pairs] + [(pairs[0], c) for c in cfg.data.corpora]


def reserved_symbols(cfg: Config) -> tuple[str, ...]:
    """The pieces a new BPE model reserves whole: the target-language tokens of several
    target languages (mt/data/pairs.py), and <BT> where a corpus is tagged as back-translated."""
    langs = Languages.of(cfg.data)
    symbols = tuple(tag(lang) for lang in langs.targets) if langs.tagged else ()
    return symbols + ((BT_TAG,) if any(c.tagged for c in cfg.data.corpora) else ())


def check_tag(corpus: CorpusConfig | None, tokenizer) -> None:
    """A tagged corpus needs the <BT> piece in the run's BPE model: refused in one line when
    the model has none (made, or taken from model.init_from, without a tagged corpus)."""
    if corpus is not None and corpus.tagged and not tokenizer.reserves(BT_TAG):
        raise MTError(
            f"data.corpora {corpus.name} is tagged, but the run's BPE model has no {BT_TAG} "
            f"piece (it was trained, or taken from model.init_from, without a tagged corpus): "
            f"train into a new --run-dir, or remove `tagged`"
        )


def part_weights(cfg: Config) -> tuple[float, ...] | None:
    """The parts' weights in an epoch's draw (the main corpus's 1), where data.corpora has."""
    return (1.0, *(c.weight for c in cfg.data.corpora)) if cfg.data.corpora else None


def unique_pairs(pairs: Iterable[tuple[str, str]], stats: Stats) -> Iterator[tuple[str, str]]:
    """The pairs without those seen before (counted in stats.duplicate); a pair is known by
    a 16-byte digest, not kept whole."""
    seen: set[bytes] = set()
    for s, t in pairs:
        key = hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=16).digest()
        if key in seen:
            stats.duplicate += 1
            continue
        seen.add(key)
        yield s, t


def sample_pairs(
    pairs: Iterable[tuple[str, str]], n: int, seed: int
) -> tuple[list[str], list[str]]:
    """At most n pairs drawn uniformly (reservoir sampling) in one streaming pass."""
    rng, sample = random.Random(seed), []
    for i, pair in enumerate(pairs):
        if i < n:
            sample.append(pair)
        else:
            j = rng.randrange(i + 1)
            if j < n:
                sample[j] = pair
    return [s for s, _ in sample], [t for _, t in sample]
