"""Sentencepiece BPE: trained once on the training split, stored in the run directory and in
every checkpoint, so training, translation and evaluation tokenize text identically."""

from __future__ import annotations

import functools
import io
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from mt.data.bpe_dropout import MergeDropout, seed_dropout
from mt.errors import MTError
from mt.outputs import write_bytes
from mt.tokens import BOS, BT_TAG, EOS, PAD, UNK


class HeldToken(MTError):
    """A source line (number `index`, from 0) holding a reserved token as text
    (Tokenizer.held_token): a target-language token would tell the model the output's
    language, against the one the translation asks for; <BT> would pass the line off as a
    back-translation."""

    def __init__(self, index: int, token: str):
        why = (
            "the tag of back-translated training sources, as text: remove it"
            if token == BT_TAG
            else "a target-language token of this model, as text: remove it (the target "
            "language is chosen by --tgt-lang)"
        )
        super().__init__(f"line {index + 1} holds {token!r}, {why}")
        self.index, self.token = index, token


def train_bpe(
    lines: Iterable[str],
    vocab_size: int,
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 0,
    symbols: tuple[str, ...] = (),
) -> bytes:
    """Train a BPE model on `lines`; returns the serialized model. symbols: pieces reserved
    whole (the target-language tokens of mt/data/pairs.py), numbered after the special ones."""
    lines = [line for line in lines if line]
    if len(lines) > max_sentences:
        lines = random.Random(seed).sample(lines, max_sentences)
    if not lines:
        raise MTError("cannot train BPE: the training text is empty")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="bpe",
        vocab_size=vocab_size,
        # A soft limit: small corpora (tests, toy tasks) cannot fill a large vocabulary.
        hard_vocab_limit=False,
        character_coverage=character_coverage,
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        max_sentence_length=1 << 16,
        num_threads=2,
        minloglevel=2,
        # Keep digits and unknown characters round-trippable instead of mapping them to <unk>.
        split_digits=True,
        byte_fallback=False,
        user_defined_symbols=",".join(symbols),  # (pieces of ">>", letters and "<<": no comma)
    )
    return buf.getvalue()


def _load(model: bytes) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model)
    except Exception as e:  # sentencepiece raises RuntimeError/OSError with C++ text
        raise MTError(
            f"the sentencepiece model is corrupt ({e}); retrain it by removing it "
            f"from the run directory"
        ) from None
    return sp


def _encode(sp: spm.SentencePieceProcessor, lines: list[str], dropout: float, out_type=int):
    """The lines as ids (out_type int) or pieces (str); dropout > 0: BPE-dropout's
    segmentation (mt/data/bpe_dropout.py), drawn anew at each call."""
    if not dropout:
        return sp.Encode(lines, out_type=out_type)
    pieces = _merges(sp).encode(lines, dropout)
    return pieces if out_type is str else [[sp.PieceToId(p) for p in line] for line in pieces]


@functools.lru_cache(maxsize=8)
def _merges(sp: spm.SentencePieceProcessor) -> MergeDropout:
    return MergeDropout(sp)


# the files of a run's tokenizer: one joint BPE model, or a source and a target one, and the
# model's own vocabulary where its ids are not the BPE models' (Vocabulary)
VOCAB_FILE = "vocab.json"
MODEL_FILES = ("spm.model", "spm.src.model", "spm.tgt.model", VOCAB_FILE)


@dataclass(frozen=True)
class Vocabulary:
    """A model's own token ids where they are not the sentencepiece models' ids: a model
    imported from transformers numbers its pieces in a vocab.json of its own (one list over
    two sentencepiece models, as OPUS-MT's), and a text's pieces are looked up there, as
    MarianTokenizer does (a piece not in it is <unk>). src, tgt: the piece of each id (the same
    list when both sides share the ids); ids PAD, UNK, BOS and EOS are mt's special tokens."""

    src: tuple[str, ...]
    tgt: tuple[str, ...]

    def to_json(self) -> bytes:
        return json.dumps({"src": self.src, "tgt": self.tgt}, ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Vocabulary:
        try:
            raw = json.loads(data)
            vocab = cls(tuple(raw["src"]), tuple(raw["tgt"]))
        except (ValueError, KeyError, TypeError):
            vocab = None
        if vocab is None or not all(
            len(side) > EOS and all(isinstance(p, str) for p in side)
            for side in (vocab.src, vocab.tgt)
        ):
            raise MTError(
                f"{where} is damaged (not a vocabulary of src and tgt pieces); restore it, "
                f"or start the run again from its model.init_from"
            )
        return vocab


class _Side:
    """One side's text <-> ids: a sentencepiece model, and where the model numbers the pieces
    its own way, that numbering (pieces: id -> piece)."""

    def __init__(self, sp: spm.SentencePieceProcessor, pieces: tuple[str, ...] | None):
        self.sp, self.pieces = sp, pieces
        self.ids = None if pieces is None else {p: i for i, p in enumerate(pieces)}
        # the target-language tokens (mt/data/pairs.py) and the back-translation tag its BPE
        # reserved, which sentencepiece reads whole wherever a text holds them; a model with
        # its own numbering (imported from transformers) reads a language token whole only at
        # the head of a line, as MarianTokenizer
        self.reserved = () if pieces is not None else tuple(filter(_reserved, self.all_pieces()))

    @property
    def size(self) -> int:
        return self.sp.GetPieceSize() if self.pieces is None else len(self.pieces)

    def encode(self, lines: list[str], dropout: float) -> list[list[int]]:
        if self.ids is None and not any(line.startswith((">>", BT_TAG)) for line in lines):
            return _encode(self.sp, lines, dropout)
        if self.ids is None:  # a line led by tokens this model reserved
            codes, texts = zip(*map(self._own_code, lines), strict=True)
            rest = _encode(self.sp, list(texts), dropout)
            return [[*code, *ids] for code, ids in zip(codes, rest, strict=True)]
        ids = self.ids
        codes, texts = zip(*map(_language_code, lines), strict=True) if lines else ((), ())
        return [
            [ids.get(p, UNK) for p in (*code, *pieces)]
            for code, pieces in zip(codes, _encode(self.sp, list(texts), dropout, str), strict=True)
        ]

    def _own_code(self, line: str) -> tuple[tuple[int, ...], str]:
        """(the ids of the reserved tokens that lead `line`: a target-language token, then
        <BT>, each where the model reserved it (mt/data/pairs.py; another text starting with
        ">>" is text), the rest of the line)."""
        ids: list[int] = []
        while True:
            codes, rest = _language_code(line)
            if not codes and line.startswith(BT_TAG):
                codes, rest = (BT_TAG,), line[len(BT_TAG) :]
            i = self.sp.PieceToId(codes[0]) if codes else UNK
            if i == UNK:
                return tuple(ids), line
            ids.append(i)
            line = rest.lstrip()

    def held_token(self, text: str, lead: bool) -> str | None:
        """The reserved token `text` holds as text (past the one that leads it, where `lead`
        allows one), which would reach the model as the token itself; None if it holds none."""
        if not self.reserved or ("<<" not in text and BT_TAG not in text):
            return None
        if lead:
            codes, rest = _language_code(text)
            text = rest if codes and codes[0] in self.reserved else text
        return next((t for t in self.reserved if t in text), None)

    def decode(self, ids: list[list[int]]) -> list[str]:
        if self.pieces is None:
            return self.sp.Decode(ids)
        # a shared vocabulary holds pieces of the other side's model too, which this side's
        # leaves as they are: their word boundaries are made spaces here
        return [
            self.sp.DecodePieces([self.pieces[i] for i in line]).replace("\u2581", " ").strip()
            for line in ids
        ]

    def piece(self, i: int) -> str:
        return self.sp.IdToPiece(i) if self.pieces is None else self.pieces[i]

    def all_pieces(self) -> list[str]:
        """The piece of every id, in id order."""
        return (
            list(self.pieces)
            if self.pieces is not None
            else [self.sp.IdToPiece(i) for i in range(self.sp.GetPieceSize())]
        )


def _reserved(piece: str) -> bool:
    """Whether a BPE model's piece is one mt reserves (a target-language token, <BT>)."""
    return piece == BT_TAG or (piece.startswith(">>") and piece.endswith("<<"))


def _language_code(line: str) -> tuple[tuple[str, ...], str]:
    """A multilingual Marian model's target-language token that starts a source line (">>fr<<
    Hello"), a piece of its own, and the rest of the line, as MarianTokenizer splits them."""
    end = line.find("<<") if line.startswith(">>") else -1
    return ((line[: end + 2],), line[end + 2 :]) if end != -1 else ((), line)


class Tokenizer:
    """Source and target sentencepiece models (the same object when the vocabulary is joint),
    and the model's own numbering of their pieces where it has one (`vocab`, Vocabulary)."""

    def __init__(
        self, src_model: bytes, tgt_model: bytes | None = None, vocab: Vocabulary | None = None
    ):
        self.src_model = src_model
        self.tgt_model = tgt_model if tgt_model is not None else src_model
        self.joint = tgt_model is None or tgt_model == src_model
        self.vocab = vocab
        self.src = _load(self.src_model)
        self.tgt = self.src if self.joint else _load(self.tgt_model)
        self._src = _Side(self.src, None if vocab is None else vocab.src)
        self._tgt = _Side(self.tgt, None if vocab is None else vocab.tgt)

    @property
    def shared_ids(self) -> bool:
        """Whether a token id means the same piece on both sides (what tied source and target
        embeddings need)."""
        return self.joint if self.vocab is None else self.vocab.src == self.vocab.tgt

    @property
    def src_vocab_size(self) -> int:
        return self._src.size

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.size

    def encode_src(self, lines: list[str], dropout: float = 0.0) -> list[list[int]]:
        return self._src.encode(lines, dropout)

    def encode_tgt(self, lines: list[str], dropout: float = 0.0) -> list[list[int]]:
        return self._tgt.encode(lines, dropout)

    @staticmethod
    def seed_dropout(seed: int) -> None:
        """Seed the sampling of `dropout` > 0 encodings (one generator per process), so that
        every rank, and a resumed run, segments an epoch identically."""
        seed_dropout(seed)

    def held_token(self, text: str, side: str = "src") -> str | None:
        """A target-language token (mt/data/pairs.py) that `text` holds as text, where the
        model would read the token itself: past the one token a source line may lead with
        (side src), anywhere in a target text (side tgt); None if it holds none. User text
        that holds one is refused (check_sources, options.check_prefix): it would choose the
        language."""
        return (self._src if side == "src" else self._tgt).held_token(text, side == "src")

    def reserves(self, piece: str) -> bool:
        """Whether the source side's BPE model reserved `piece` whole (mt/data/pairs.py's
        target-language tokens, <BT>)."""
        return piece in self._src.reserved

    def never_written(self) -> int | None:
        """The target-side id of <BT> where the BPE model reserved it (a run with a tagged
        corpus, data.corpora): a token a translation never contains; else None."""
        if BT_TAG not in self._tgt.reserved:
            return None
        return self._tgt.sp.PieceToId(BT_TAG)

    def check_sources(self, lines: list[str]) -> None:
        """Refuse source lines that hold a target-language token as text (held_token)."""
        for i, line in enumerate(lines):
            held = self.held_token(line, "src")
            if held:
                raise HeldToken(i, held)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self._tgt.decode(ids)

    def src_pieces_of(self, ids: list[int]) -> list[str]:
        return [self._src.piece(i) for i in ids]

    def tgt_pieces_of(self, ids: list[int]) -> list[str]:
        return [self._tgt.piece(i) for i in ids]

    def pieces(self, side: str) -> list[str]:
        """The piece of every id of `side` (src or tgt), in id order."""
        return (self._src if side == "src" else self._tgt).all_pieces()

    # -- files in the run directory -------------------------------------------------------
    def save(self, run_dir: Path) -> None:
        """The BPE model(s) and vocabulary into `run_dir`, each file whole or not at all."""
        if self.joint:
            write_bytes(run_dir / "spm.model", self.src_model)
        else:
            write_bytes(run_dir / "spm.src.model", self.src_model)
            write_bytes(run_dir / "spm.tgt.model", self.tgt_model)
        if self.vocab is not None:
            write_bytes(run_dir / VOCAB_FILE, self.vocab.to_json())

    @classmethod
    def load(cls, run_dir: Path) -> Tokenizer | None:
        vocab_file = run_dir / VOCAB_FILE
        vocab = (
            Vocabulary.from_json(vocab_file.read_bytes(), str(vocab_file))
            if vocab_file.is_file()
            else None
        )
        if (run_dir / "spm.model").is_file():
            return cls((run_dir / "spm.model").read_bytes(), vocab=vocab)
        if (run_dir / "spm.src.model").is_file() and (run_dir / "spm.tgt.model").is_file():
            return cls(
                (run_dir / "spm.src.model").read_bytes(),
                (run_dir / "spm.tgt.model").read_bytes(),
                vocab,
            )
        return None

    @classmethod
    def train(
        cls,
        src_lines: list[str],
        tgt_lines: list[str],
        *,
        vocab_size: int,
        joint: bool,
        character_coverage: float,
        max_sentences: int,
        seed: int,
        symbols: tuple[str, ...] = (),
    ) -> Tokenizer:
        """symbols: pieces the source side reserves whole (target-language tokens)."""

        def bpe(lines: list[str], reserved: tuple[str, ...] = ()) -> bytes:
            return train_bpe(lines, vocab_size, character_coverage, max_sentences, seed, reserved)

        if joint:
            return cls(bpe(src_lines + tgt_lines, symbols))
        return cls(bpe(src_lines, symbols), bpe(tgt_lines))
