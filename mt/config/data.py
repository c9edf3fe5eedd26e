"""The data and tokenizer sections: where the corpus is and how it becomes subwords."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mt.config.section import Section, no_number, user_path

_LANG = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")  # (a file suffix: no dot, dash or slash)


def split_pair(text: str) -> tuple[str, str]:
    """ "en-de" -> ("en", "de"): a language pair as data.pairs writes it."""
    src, sep, tgt = text.partition("-")
    if not (sep and _LANG.fullmatch(src) and _LANG.fullmatch(tgt)) or src == tgt:
        raise ValueError(
            f"{text!r} is not a language pair: write it SRC-TGT, two different language "
            f"suffixes of the corpus files (e.g. en-de for train.en and train.de)"
        )
    return src, tgt


class CorpusConfig(Section):
    """One more training corpus of the run's pair, beside train.{src_lang} and train.{tgt_lang}:
    in-domain against general text, or back-translations against real ones."""

    name: str = Field(
        description="its files: train.NAME.{src_lang} and train.NAME.{tgt_lang} in data.dir"
    )
    weight: float = Field(
        1.0,
        gt=0.0,
        le=1000.0,
        description="how often each of its pairs is drawn against a pair of the main corpus "
        "(2: twice as often; an epoch is as long as all the corpora together)",
    )
    tagged: bool = Field(
        False,
        description="each of its sources starts with the reserved token <BT> (tagged "
        "back-translation: its sources are a reverse model's translations), so that the model "
        "tells them from real ones; translations never contain it",
    )

    @field_validator("name")
    @classmethod
    def _a_file_name_part(cls, v: str) -> str:
        if not _LANG.fullmatch(v):
            raise ValueError(f"{v!r}: letters, digits and _ only (a part of its files' names)")
        return v


class DataConfig(Section):
    dir: str = Field("data/multi30k", description="folder with {train,valid,test}.{lang}")
    src_lang: str = Field("de", description="source language: the suffix of the source files")
    tgt_lang: str = Field("en", description="target language: the suffix of the target files")
    dataset: str | None = Field(
        None,
        description="corpus to download into dir when it holds none yet (multi30k, wmt14, "
        "synthetic, or a Hugging Face hub id); unset: the corpus must already be there",
    )
    dataset_config: str | None = Field(
        None, description="the hub dataset's configuration, e.g. de-en for wmt14"
    )
    max_len: int = Field(
        128, ge=1, le=1 << 16, description="pairs longer than this (subwords) are dropped"
    )
    max_len_ratio: float = Field(
        0.0,
        ge=0.0,
        le=1000.0,
        description="training pairs whose longer side has more than this many times the "
        "subwords of the shorter are dropped and counted (Moses' clean-corpus-n uses 9); 0: "
        "every ratio kept",
    )
    corpora: list[CorpusConfig] = Field(
        [],
        max_length=64,
        description="more training corpora of the pair, each with its weight, e.g. [{name: "
        "news, weight: 2}] for train.news.{src_lang} and train.news.{tgt_lang}; one pair only",
    )
    drop_duplicates: bool = Field(
        False,
        description="training pairs seen before in the same corpus (the same source and "
        "target, as cleaned) are dropped and counted",
    )
    pairs: list[str] = Field(
        [],
        max_length=256,
        description="several language pairs in one model, e.g. [en-de, en-fr, en-cs], each "
        "read from the pair's own {split}.{src}-{tgt}.{lang} files in dir where there, else "
        "from {split}.{src} and {split}.{tgt}; with more than one target language "
        "each source starts with the target's token (>>de<<; mt/data/pairs.py). src_lang and "
        "tgt_lang are then the direction translation takes when none is asked for (the first "
        "pair's unless set). Empty: the one pair src_lang-tgt_lang",
    )
    pair_temperature: float = Field(
        1.0,
        ge=0.1,
        le=100.0,
        description="data.pairs: pair i is drawn in proportion to its size ** (1 / T); 1: the "
        "corpus's own proportions; larger: the small pairs drawn more often (again within an "
        "epoch), the large ones less",
    )

    target_token: bool | None = Field(
        None,
        description="whether each source starts with its target language's token (>>de<<): "
        "null: where data.pairs has more than one target language; true: always (a "
        "multilingual model imported with model.init_from needs its token even for one "
        "pair, and the import sets this); false: never (one target language only)",
    )

    text: Literal["raw", "lc_tok"] = Field(
        "raw",
        description="raw: the text as the corpus has it (cased, detokenized); lc_tok: "
        "lowercased, punctuation-normalised and tokenized by the Moses scripts, as Multi30k's "
        "task1-tokenize.sh and the published Multi30k models have it: training and sources "
        "read so, translations written lowercased and detokenized (score them with mt eval "
        "--lc-tok, the papers' protocol; mt/data/textform.py)",
    )

    _dir_is_a_path = field_validator("dir", mode="before")(user_path)
    token_cache: Literal["auto", True, False] = Field(
        "auto",
        description="keep the training split's token ids (each pair's, each corpus's of "
        "data.corpora) in a memory-mapped cache (MT_CACHE_DIR, else ~/.cache/mt) that later "
        "runs and every rank of a machine share; auto: for training files of 100 MB or more",
    )

    @model_validator(mode="before")
    @classmethod
    def _direction_of_pairs(cls, v: Any) -> Any:
        """With data.pairs, src_lang and tgt_lang default to the first pair's, and must name
        one of them."""
        if not isinstance(v, dict) or not v.get("pairs"):
            return v
        if not isinstance(v["pairs"], list) or not all(isinstance(p, str) for p in v["pairs"]):
            return v  # (the field's own check says what is wrong)
        pairs = [split_pair(p) for p in v["pairs"]]
        if len(set(pairs)) < len(pairs):
            raise ValueError(f"data.pairs {v['pairs']} names a pair twice")
        v = {"src_lang": pairs[0][0], "tgt_lang": pairs[0][1], **v}
        if (str(v["src_lang"]), str(v["tgt_lang"])) not in pairs:
            raise ValueError(
                f"data.src_lang and data.tgt_lang ({v['src_lang']}-{v['tgt_lang']}) are the "
                f"direction translation takes by default and must be one of data.pairs "
                f"({', '.join(v['pairs'])}); leave them out for the first pair's"
            )
        return v

    @model_validator(mode="after")
    def _several_targets_need_their_token(self) -> DataConfig:
        targets = {split_pair(p)[1] for p in self.pairs}
        if self.target_token is False and len(targets) > 1:
            raise ValueError(
                f"data.target_token is false, but data.pairs has {len(targets)} target "
                f"languages ({', '.join(sorted(targets))}): the token is how the model knows "
                f"which to write; remove data.target_token"
            )
        if self.src_lang == self.tgt_lang:
            raise ValueError(
                f"data.src_lang and data.tgt_lang are both {self.src_lang!r}: the model would "
                f"learn to copy its input (train.{self.src_lang} read as both sides); set "
                f"data.tgt_lang to the suffix of the target files"
            )
        if self.text != "raw" and len(self.pairs) > 1:
            raise ValueError(
                f"data.text {self.text} reads one language pair (the Moses scripts tokenize "
                f"each language its own way); use data.text raw with data.pairs"
            )
        return self

    @field_validator("token_cache", "drop_duplicates", mode="before")
    @classmethod
    def _token_cache_is_not_a_number(cls, v: Any) -> Any:
        return no_number(v)

    @model_validator(mode="after")
    def _corpora_of_one_pair(self) -> DataConfig:
        names = [c.name for c in self.corpora]
        if len(set(names)) < len(names):
            raise ValueError("data.corpora: a corpus named twice; give each its own name")
        if self.corpora and len(self.pairs) > 1:
            raise ValueError(
                "data.corpora weighs the corpora of one pair; with data.pairs give each pair "
                "its files (train.SRC-TGT.LANG) and data.pair_temperature instead"
            )
        return self

    @field_validator("max_len_ratio")
    @classmethod
    def _a_ratio_of_one_or_more(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError(f"{v}: the longer side over the shorter is 1 or more (0: off)")
        return v


class TokenizerConfig(Section):
    vocab_size: int = Field(
        8000, ge=16, le=1 << 20, description="BPE pieces (each side's, or both's when joint)"
    )
    joint: bool = Field(
        True,
        description="one BPE model for source and target (needed by model.tie_embeddings: all "
        "and train.bidirectional_share)",
    )
    character_coverage: float = Field(
        1.0, gt=0.0, le=1.0, description="share of characters the BPE model covers (sentencepiece)"
    )
    max_sentences: int = Field(
        2_000_000, ge=1, le=2**31 - 1, description="sentences sampled to train BPE"
    )
