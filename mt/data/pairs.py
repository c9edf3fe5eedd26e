"""Several language pairs in one model (data.pairs): which pairs, the token that tells the
model its target language, and how often each pair is drawn.

The model learns every direction from one corpus of all the pairs. Where the pairs have more
than one target language, each source sentence starts with a token naming the language to
translate into (Johnson et al., 2017, "Google's Multilingual NMT": `<2es>`), spelt `>>fr<<` as
OPUS-MT's multilingual Marian models spell it, so that an exported model reads the same
requests. The token is one piece of the BPE model, reserved when it is trained
(mt/data/tokenizer.py), and a source line that begins with it is encoded with it whatever the
text after.

Pairs are drawn by a temperature over their sizes (Arivazhagan et al., 2019): pair i's share
of an epoch is proportional to n_i ** (1 / T), so T = 1 keeps the corpus's own proportions and
a larger T gives the small pairs more of each epoch (drawn again) and the large ones less.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mt.config.data import split_pair
from mt.errors import MTError


class SourceError(MTError):
    """A translation from a language the model never translated from: the source is at
    fault (a request's src_lang), not the target."""


@dataclass(frozen=True)
class Pair:
    src: str
    tgt: str

    @classmethod
    def parse(cls, text: str) -> Pair:
        """ "en-de" -> Pair("en", "de") (mt.config.data.split_pair's checks)."""
        return cls(*split_pair(text))

    def __str__(self) -> str:
        return f"{self.src}-{self.tgt}"


def tag(lang: str) -> str:
    """The target-language token: the piece a source sentence starts with."""
    return f">>{lang}<<"


def tagged(lines: list[str], lang: str | None) -> list[str]:
    """`lines` each led by the token of target language `lang` (None: as they are); an empty
    line stays empty (its translation is empty)."""
    if lang is None:
        return lines
    return [f"{tag(lang)} {line}" if line.strip() else line for line in lines]


@dataclass(frozen=True)
class Languages:
    """A model's pairs (data.pairs; one pair for a bilingual model), the direction it
    translates when none is asked for, and whether its sources carry the target-language
    token (more than one target language)."""

    pairs: tuple[Pair, ...]
    default: Pair
    token: bool | None = None  # data.target_token: None where more than one target

    @classmethod
    def of(cls, data) -> Languages:
        """The pairs of a data config: data.pairs, else (data.src_lang, data.tgt_lang)."""
        default = Pair(data.src_lang, data.tgt_lang)
        pairs = tuple(Pair.parse(p) for p in data.pairs) or (default,)
        return cls(pairs, default, data.target_token)

    @property
    def tagged(self) -> bool:
        """Whether sources start with their target language's token: data.target_token, by
        default where the pairs have more than one target language."""
        return self.token if self.token is not None else len(self.targets) > 1

    @property
    def targets(self) -> list[str]:
        return sorted({p.tgt for p in self.pairs})

    @property
    def sources(self) -> list[str]:
        return sorted({p.src for p in self.pairs})

    @property
    def every(self) -> list[str]:
        """Every language of the pairs, read or written."""
        return sorted({lang for p in self.pairs for lang in (p.src, p.tgt)})

    def tag_of(self, pair: Pair) -> str | None:
        """The target language whose token leads this pair's sources (None: untagged)."""
        return pair.tgt if self.tagged else None

    def choose(self, src: str | None, tgt: str | None, warn) -> Pair:
        """The pair a translation asks for (--src-lang/--tgt-lang, a request's languages;
        None: the default's, or a trained pair's with the other language given): one the
        model was trained on, or, where the model is told its target language, an unseen one
        from one of its source languages into another of its target languages (zero-shot,
        said by warn()); anything else (a language it never read, the same language on both
        sides) is refused, naming what the model knows."""
        d = self.default
        if tgt is None:
            tgt = _first(p.tgt for p in (d, *self.pairs) if p.src == (src or d.src)) or d.tgt
        if src is None:
            src = _first(p.src for p in (d, *self.pairs) if p.tgt == tgt) or d.src
        pair = Pair(src, tgt)
        if pair in self.pairs:
            return pair
        if len(self.pairs) == 1:
            raise MTError(
                f"this model translates {d} only (a bilingual model), not {pair}: leave out "
                f"--src-lang and --tgt-lang, or train one model on several pairs (data.pairs)"
            )
        if src not in self.sources:
            raise SourceError(
                f"{pair}: this model never translated from {src} (its encoder never read it); "
                f"its source languages are {', '.join(self.sources)} ({self.describe()})"
            )
        if src == tgt:
            others = [t for t in self.targets if t != src]
            raise MTError(
                f"{pair}: the same language on both sides (a copy); choose the target, one of "
                f"{', '.join(others)} (--tgt-lang, a request's tgt_lang)"
            )
        if self.tagged and pair.tgt in self.targets:
            warn(f"warning: {pair} was not trained (zero-shot); the model knows {self.describe()}")
            return pair
        raise MTError(
            f"{pair}: this model translates {self.describe()}; its target languages are "
            f"{', '.join(self.targets)} and its source languages {', '.join(self.sources)}"
        )

    def describe(self) -> str:
        return ", ".join(map(str, self.pairs))


def lead_token(languages: Languages | None, src: str | None, tgt: str | None, warn) -> str | None:
    """The target language whose token leads the sources of a translation from `src` into
    `tgt` (None: the default direction), or None where the model needs none; a pair the model
    cannot translate is refused (Languages.choose). languages None: a model that does not say
    (one of its own, as a test builds it)."""
    if languages is None:
        if src or tgt:
            raise MTError("this model does not say which languages it translates")
        return None
    return languages.tag_of(languages.choose(src, tgt, warn))


def _first(items) -> str | None:
    return next(iter(items), None)


def pair_shares(sizes: list[int], temperature: float) -> np.ndarray:
    """Each pair's share of an epoch, proportional to size ** (1 / temperature)."""
    weights = np.asarray(sizes, dtype=np.float64) ** (1.0 / temperature)
    return weights / weights.sum()


def epoch_members(
    pair_of: np.ndarray, temperature: float, seed: int, weights: tuple[float, ...] | None = None
) -> np.ndarray | None:
    """The examples an epoch walks, as indices into the corpus (pair_of: each example's part,
    a pair or a corpus of data.corpora, the parts one after another as the corpus holds them):
    as many as the corpus holds, part i's pair_shares of them times its weight (renormalised),
    a part drawn beyond its size walked whole and then again from a new shuffle. None where
    that is the corpus itself, each example once (one part, or temperature 1, weights 1)."""
    sizes = np.bincount(pair_of).tolist()
    w = np.ones(len(sizes)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(sizes) < 2 or (temperature == 1.0 and bool((w == 1.0).all())):
        return None
    shares = pair_shares(sizes, temperature) * w
    counts = np.floor(shares / shares.sum() * len(pair_of)).astype(np.int64)
    counts[: len(pair_of) - int(counts.sum())] += 1  # (the rounding's remainder, one each)
    rng = np.random.default_rng(seed)
    starts = np.r_[0, np.cumsum(sizes)]
    parts = []
    for i, want in enumerate(counts.tolist()):
        own = np.arange(starts[i], starts[i + 1])
        rounds = [rng.permutation(own) for _ in range(-(-want // len(own)))]
        parts.append(np.concatenate(rounds)[:want] if rounds else own[:0])
    return np.concatenate(parts)
