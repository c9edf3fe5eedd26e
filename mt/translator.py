"""Load a trained model and translate lines: the one path used by `mt translate`, `mt eval`
and validation during training, so their BLEU scores agree."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mt import checkpoint
from mt.data.batching import pad_sources, token_batches
from mt.device import decode_dtype, pick_device
from mt.search import beam_search, greedy
from mt.tokens import PAD


class Translator:
    def __init__(self, model, tokenizer, decode_cfg, device: torch.device,
                 amp_dtype: torch.dtype | None = None):
        """amp_dtype: autocast dtype for the encoder and decoder layers (None: fp32); the output
        layer and log-softmax are fp32 either way (mt.search)."""
        self.model, self.tokenizer, self.cfg, self.device = model, tokenizer, decode_cfg, device
        self.amp_dtype = amp_dtype

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto",
                        precision: str = "auto") -> "Translator":
        path = checkpoint.resolve(path)
        return cls.from_dict(checkpoint.load(path), device, precision, str(path))

    @classmethod
    def from_dict(cls, ckpt: dict, device: str = "auto", precision: str = "auto",
                  source: str = "checkpoint") -> "Translator":
        """From a checkpoint already in memory (see mt.checkpoint.load)."""
        cfg, tokenizer, model = checkpoint.model_of(ckpt, source)
        dev = pick_device(device)
        return cls(model.to(dev).eval(), tokenizer, cfg.decode, dev,
                   decode_dtype(precision, cfg.train.precision, dev))

    def search(self, lines: list[str], beam: int | None = None,
               length_penalty: float | None = None, use_cache: bool = True,
               progress: bool = False) -> list[tuple[list[int], list[int]] | None]:
        """Per input line: (source ids, output ids), or None for an empty line; input order.
        progress: a bar of sentences on stderr when it is a terminal."""
        beam = beam or self.cfg.beam
        lp = self.cfg.length_penalty if length_penalty is None else length_penalty
        texts = [" ".join(line.split()) for line in lines]
        todo = [i for i, t in enumerate(texts) if t]
        ids = self.tokenizer.encode_src([texts[i] for i in todo])
        limit = self.model.max_positions - 1
        n_long = sum(len(x) > limit for x in ids)
        if n_long:
            print(f"warning: {n_long} input line(s) longer than {limit} subwords were truncated",
                  file=sys.stderr)
        ids = [x[:limit] for x in ids]
        out: list[tuple[list[int], list[int]] | None] = [None] * len(lines)
        lens = np.array([len(x) + 1 for x in ids], dtype=np.int64)
        bar = tqdm(total=len(ids), unit="sent", desc="translate", file=sys.stderr,
                   disable=None if progress and len(ids) > 1 else True, mininterval=1.0)
        # Sorted by length (no shuffling) so each batch has little padding.
        for batch in token_batches(lens, np.zeros_like(lens), self.cfg.max_tokens, seed=None):
            src = pad_sources([np.asarray(ids[i], dtype=np.int64) for i in batch]).to(self.device)
            mask = src == PAD
            with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                                enabled=self.amp_dtype is not None):
                if beam == 1:
                    hyps = greedy(self.model, src, mask, self.cfg.max_len_a, self.cfg.max_len_b,
                                  use_cache=use_cache)
                else:
                    hyps = beam_search(self.model, src, mask, beam, lp, self.cfg.max_len_a,
                                       self.cfg.max_len_b, use_cache=use_cache)
            for i, hyp in zip(batch, hyps):
                out[todo[i]] = (ids[i], hyp)
            bar.update(len(batch))
        bar.close()
        return out

    def translate(self, lines: list[str], beam: int | None = None,
                  length_penalty: float | None = None, use_cache: bool = True,
                  progress: bool = False) -> list[str]:
        """One output per input line, in input order; empty lines give empty outputs."""
        found = self.search(lines, beam, length_penalty, use_cache, progress)
        hyps = self.tokenizer.decode_tgt([f[1] for f in found if f is not None])
        it = iter(hyps)
        return [next(it) if f is not None else "" for f in found]

    def translate_with_alignment(self, lines: list[str], beam: int | None = None,
                                 length_penalty: float | None = None) -> list[str]:
        """"translation<TAB>s-t s-t ...": 0-based source-subword to output-subword links."""
        from mt.alignment import cross_attention, format_alignment, hard_alignment
        out = []
        for found in self.search(lines, beam, length_penalty):
            if found is None:
                out.append("\t")
                continue
            weights = cross_attention(self.model, found[0], found[1], self.device)
            text = self.tokenizer.decode_tgt([found[1]])[0]
            out.append(f"{text}\t{format_alignment(hard_alignment(weights))}")
        return out

    def attention(self, line: str, beam: int | None = None):
        """(translation, weights (L, H, T, S), source labels, output labels) for one sentence."""
        from mt.alignment import cross_attention
        found = self.search([line], beam)[0]
        if found is None:
            from mt.errors import MTError
            raise MTError("the sentence is empty: give some text to translate")
        src_ids, hyp = found
        weights = cross_attention(self.model, src_ids, hyp, self.device)
        src_labels = [self.tokenizer.src.IdToPiece(i) for i in src_ids] + ["</s>"]
        tgt_labels = self.tokenizer.tgt_pieces_of(hyp) + ["</s>"]
        return self.tokenizer.decode_tgt([hyp])[0], weights, src_labels, tgt_labels
