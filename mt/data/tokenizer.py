"""Sentencepiece BPE: trained once on the training split, stored in the run directory and in
every checkpoint, so training, translation and evaluation tokenize text identically."""

from __future__ import annotations

import io
import random
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from mt.errors import MTError
from mt.tokens import BOS, EOS, PAD, UNK


def train_bpe(
    lines: Iterable[str],
    vocab_size: int,
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 0,
) -> bytes:
    """Train a BPE model on `lines`; returns the serialized model."""
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


def _encode(sp: spm.SentencePieceProcessor, lines: list[str], dropout: float) -> list[list[int]]:
    if not dropout:
        return sp.Encode(lines)
    # For a BPE model, sentencepiece's sampling with alpha = p is BPE-dropout (each merge
    # skipped with probability p). One thread: with several, the segmentation a seed gives
    # depends on the thread schedule, and the ranks (or a resumed run) would disagree.
    return sp.Encode(lines, enable_sampling=True, alpha=dropout, nbest_size=-1, num_threads=1)


# the BPE model files a run directory holds: one joint model, or a source and a target one
MODEL_FILES = ("spm.model", "spm.src.model", "spm.tgt.model")


class Tokenizer:
    """Source and target sentencepiece models (the same object when the vocabulary is joint)."""

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None):
        self.src_model = src_model
        self.tgt_model = tgt_model if tgt_model is not None else src_model
        self.joint = tgt_model is None or tgt_model == src_model
        self.src = _load(self.src_model)
        self.tgt = self.src if self.joint else _load(self.tgt_model)

    @property
    def src_vocab_size(self) -> int:
        return self.src.GetPieceSize()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.GetPieceSize()

    def encode_src(self, lines: list[str], dropout: float = 0.0) -> list[list[int]]:
        return _encode(self.src, lines, dropout)

    def encode_tgt(self, lines: list[str], dropout: float = 0.0) -> list[list[int]]:
        return _encode(self.tgt, lines, dropout)

    @staticmethod
    def seed_dropout(seed: int) -> None:
        """Seed the sampling of `dropout` > 0 encodings (sentencepiece has one generator per
        process), so that every rank, and a resumed run, segments an epoch identically."""
        spm.set_random_generator_seed(seed)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self.tgt.Decode(ids)

    def src_pieces(self, line: str) -> list[str]:
        return self.src.EncodeAsPieces(line)

    def tgt_pieces_of(self, ids: list[int]) -> list[str]:
        return [self.tgt.IdToPiece(i) for i in ids]

    # -- files in the run directory -------------------------------------------------------
    def save(self, run_dir: Path) -> None:
        if self.joint:
            (run_dir / "spm.model").write_bytes(self.src_model)
        else:
            (run_dir / "spm.src.model").write_bytes(self.src_model)
            (run_dir / "spm.tgt.model").write_bytes(self.tgt_model)

    @classmethod
    def load(cls, run_dir: Path) -> Tokenizer | None:
        if (run_dir / "spm.model").is_file():
            return cls((run_dir / "spm.model").read_bytes())
        if (run_dir / "spm.src.model").is_file() and (run_dir / "spm.tgt.model").is_file():
            return cls(
                (run_dir / "spm.src.model").read_bytes(), (run_dir / "spm.tgt.model").read_bytes()
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
    ) -> Tokenizer:
        def bpe(lines: list[str]) -> bytes:
            return train_bpe(lines, vocab_size, character_coverage, max_sentences, seed)

        if joint:
            return cls(bpe(src_lines + tgt_lines))
        return cls(bpe(src_lines), bpe(tgt_lines))
