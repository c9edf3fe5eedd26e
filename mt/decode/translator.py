"""Load a trained model and translate lines: the one path used by `mt translate`, `mt eval`
and validation during training, so their BLEU scores agree."""

from __future__ import annotations

import math
import secrets
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from mt.artifacts import checkpoint
from mt.artifacts.members import tuned_decoding
from mt.config import DecodeConfig
from mt.data.batching import pad_sources, token_batches
from mt.data.pairs import Languages
from mt.data.textform import RAW, TextForm, text_form
from mt.data.tokenizer import Tokenizer
from mt.decode.mask_predict import mask_predict
from mt.decode.options import DecodeOptions, check_prefix
from mt.decode.sampling import Sampling
from mt.decode.search import EVERY_STEP, ON_DEVICE, decoding_steps, max_lengths, search
from mt.decode.step import CompiledStep, announce_compile, compile_pays
from mt.errors import MTError
from mt.model import Seq2Seq
from mt.runtime.device import autocast, decode_dtype, fp32_matmuls, pick_device
from mt.tokens import EOS, PAD

# one line's search result: (its source ids, [(output ids, score or None), ...] best first)
Found = tuple[list[int], list[tuple[list[int], float | None]]]


class Translator:
    """The Python API: load a run directory or checkpoint (or several: an ensemble) once,
    translate lists of strings with the CLI's options.

        from mt import Translator
        t = Translator.load("runs/multi30k_de_en")
        t.translate(["Ein Hund läuft im Schnee."], beam=5)
        t.translate_nbest(["Ein Hund läuft im Schnee."], nbest=3, beam=5)
        t.translate(["Ein Hund läuft."], sampling=Sampling(topp=0.9, seed=1))
    """

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        decode_cfg: DecodeConfig,
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
        languages: Languages | None = None,
        text: TextForm = RAW,
    ) -> None:
        """amp_dtype: autocast dtype for the encoder and decoder layers (None: fp32); the output
        layer and log-softmax are fp32 either way (mt.decode.search); languages: the pairs
        the model was trained on (mt/data/pairs.py; None: unknown, a model of its own)."""
        self.model, self.tokenizer, self.cfg, self.device = model, tokenizer, decode_cfg, device
        self.amp_dtype, self.languages, self.text = amp_dtype, languages, text
        fp32_matmuls(device, amp_dtype)
        self._compiled: CompiledStep | None = None  # see compiled()
        # how many jobs like each search call this translator will decode (validation: one per
        # validation of the run; a server: without end), for decode.compile_step auto
        self.repeats: float = 1
        self.step = 0  # the updates its (first) model was trained (from_trained)
        self.never = tokenizer.never_written()  # (<BT>: banned from every output)

    @classmethod
    def load(
        cls, paths: str | Path | Sequence[str | Path], device: str = "auto", precision: str = "auto"
    ) -> Translator:
        """A run directory (its best.pt, else last.pt) or checkpoint; several make an ensemble
        that averages the models' log-probabilities at every step (one BPE model required;
        decoding settings and precision from the first). A run of several members
        (train.members) is their ensemble, with the decoding tuned for them together."""
        found = checkpoint.resolve_all([paths] if isinstance(paths, (str, Path)) else paths)
        if len(found) == 1:
            return cls.from_checkpoint(found[0], device, precision)
        from mt.decode.ensemble import ensemble_of

        model, first = ensemble_of(found, lambda run: cls.from_trained(run, device, precision))
        first.model, first.cfg = model, first.cfg.model_copy(update=tuned_decoding(found) or {})
        return first

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str = "auto", precision: str = "auto"
    ) -> Translator:
        return cls.from_trained(checkpoint.open_trained(path), device, precision)

    @classmethod
    def from_trained(
        cls, run: checkpoint.Trained, device: str = "auto", precision: str = "auto"
    ) -> Translator:
        """From a checkpoint already opened (mt.artifacts.checkpoint.open_trained)."""
        dev = pick_device(device, "--device")
        translator = cls(
            run.model.to(dev).eval(),
            run.tokenizer,
            run.config.decode,
            dev,
            decode_dtype(precision, run.precision, dev),
            Languages.of(run.config.data),
            text_form(run.config.data),
        )
        translator.step = checkpoint.trained_steps(run.ckpt)
        return translator

    @property
    def searches_on_device(self) -> bool:
        """decode.device_search: the host looks at the search every few steps (auto: on a
        GPU; on a CPU a look costs nothing and the batch shrinks at every step)."""
        choice = self.cfg.device_search
        return choice == "always" or (choice == "auto" and self.device.type == "cuda")

    def compiles_for(self, steps: float) -> bool:
        """decode.compile_step for a job of `steps` decoder steps (times `repeats`): the search
        on the device runs a compiled decoder step over a static cache (auto: on a GPU, where
        CUDA graphs replay it, for a job that repays the compile: compile_pays)."""
        on = compile_pays(self.cfg.compile_step, self.device, steps * self.repeats)
        return on and self.searches_on_device and bool(getattr(self.model, "static_cache", False))

    @property
    def compiles_step(self) -> bool:
        """Whether a job without end (a server's) would run the compiled step."""
        return self.compiles_for(math.inf)

    def compiled(self, steps: float = math.inf) -> CompiledStep | None:
        """The compiled step and its static buffers, made for the first job that repays it
        (`steps`: its decoder steps) and kept for the next jobs (their CUDA graphs too); None
        while off."""
        if self._compiled is None and self.compiles_for(steps):
            announce_compile(self.device, self.cfg.compile_step, steps * self.repeats)
            self._compiled = CompiledStep(self.device)
        return self._compiled

    @property
    def non_autoregressive(self) -> bool:
        return bool(getattr(self.model, "non_autoregressive", False))

    def options(self, **given: Any) -> DecodeOptions:
        """The run's decoding options (its decode section, as tuned on valid) with those given
        (beam, length_penalty, nbest, sampling, prefix, use_cache, nat_iterations, ...; None:
        the run's), every bound checked (mt.decode.options), and a prefix that the model's
        BPE can write."""
        opts = DecodeOptions.from_config(self.cfg, **given)
        if opts.prefix:
            check_prefix(opts.prefix, self.prefix_ids(opts.prefix), self.tokenizer)
        return opts

    def check_applies(self, **given: Any) -> None:
        """Refuse options a user gave that this model does not use (a beam for mask-predict,
        mask-predict's knobs for a search): an option is never silently ignored."""
        given = {k: v for k, v in given.items() if v is not None and v is not False}
        search_only = sorted(set(given) - {"nat_iterations", "nat_length_beam"})
        if self.non_autoregressive and search_only:
            raise MTError(
                f"{', '.join(search_only)}: this model (model.arch nat) decodes by mask-predict; "
                "set its candidate lengths (--nat-length-beam) and passes (--nat-iterations)"
            )
        if not self.non_autoregressive and len(search_only) < len(given):
            raise MTError(
                "--nat-iterations and --nat-length-beam apply to model.arch nat runs; this model "
                "searches autoregressively: use --beam and --length-penalty"
            )

    def describe(self, paths: list[Path], opts: DecodeOptions) -> str:
        """One line: which model(s) and which decoding settings a translation uses."""
        what = f"an ensemble of {len(paths)} models" if len(paths) > 1 else str(paths[0])
        if len(paths) == 1 and paths[0].name == "last.pt":  # (mt translate RUN before best.pt)
            what += f" (step {self.step:,}: the run has not validated yet, so has no best.pt)"
        if self.non_autoregressive:
            how = (
                f"mask-predict, {opts.nat_iterations} iterations, "
                f"{opts.nat_length_beam} candidate lengths"
            )
        else:
            how = opts.describe()
        return f"translating with {what} on {self.device}: {how}"

    def search(
        self,
        lines: list[str],
        opts: DecodeOptions | None = None,
        progress: bool = False,
        on_step: Callable[[int], None] | None = None,
        **given: Any,
    ) -> list[Found | None]:
        """Per input line: (source ids, [(output ids, score), ...] best first: one, or
        `opts.nbest` from beam search; the score is None for greedy search, sampling and
        mask-predict), or None for an empty line; input order. opts: the options (else the
        run's with those `given`); progress: a bar on stderr when it is a terminal;
        on_step(step): after every decoder step (it may raise to stop)."""
        opts = opts or self.options(**given)
        self.tokenizer.check_sources(lines)
        texts = [" ".join(line.split()) for line in lines]
        todo = [i for i, t in enumerate(texts) if t]
        ids = self.source_ids([texts[i] for i in todo])
        forced = self.prefix_ids(opts.prefix)
        generator = self._generator(opts.sampling)
        out: list[Found | None] = [None] * len(lines)
        lens = np.array([len(x) + 1 for x in ids], dtype=np.int64)
        bar = _progress_bar(len(ids), progress)
        # Sorted by length (no shuffling) so each batch has little padding.
        batches = token_batches(lens, np.zeros_like(lens), self.cfg.max_tokens, seed=None)
        compiled = self.compiled(self._decoder_steps(lens, batches, opts, len(forced)))
        for batch in batches:
            src = pad_sources([np.asarray(ids[i], dtype=np.int64) for i in batch]).to(self.device)
            with autocast(self.device, self.amp_dtype):
                hyps = self._decode(src, opts, forced, generator, on_step, compiled)
            for i, hyp in zip(batch, hyps, strict=True):
                out[todo[i]] = (ids[i], hyp)
            bar.update(len(batch))
        bar.close()
        return out

    @property
    def max_source_len(self) -> int:
        """The most source subwords the model reads; longer lines are cut to this."""
        return int(self.model.max_positions) - 1

    def source_lengths(self, lines: list[str]) -> list[int]:
        """Each line's source subwords, uncut (0 for an empty line), as search reads it."""
        self.tokenizer.check_sources(lines)
        texts = [" ".join(line.split()) for line in lines]
        ids = self.tokenizer.encode_src(self.text.sources([t for t in texts if t]))
        it = iter(ids)
        return [len(next(it)) if t else 0 for t in texts]

    def _decoder_steps(
        self, lens: np.ndarray, batches: list[np.ndarray], opts: DecodeOptions, forced: int
    ) -> int:
        """The most decoder steps a search of these batches can take (each batch runs to its
        longest output's limit at most; lens: each source's length with EOS): known before
        the first step, what decode.compile_step auto weighs against a compile."""
        if self.non_autoregressive:
            return 0
        limit = self.model.max_positions - 1
        return sum(
            max(decoding_steps(int(lens[i]) - 1, opts, forced, limit) for i in b)
            for b in batches
            if len(b)
        )

    def source_ids(self, texts: list[str]) -> list[list[int]]:
        ids = self.tokenizer.encode_src(self.text.sources(texts))
        limit = self.max_source_len
        n_long = sum(len(x) > limit for x in ids)
        if n_long:
            print(
                f"warning: {n_long} input line(s) longer than {limit} subwords were truncated",
                file=sys.stderr,
            )
        return [x[:limit] for x in ids]

    def prefix_ids(self, prefix: str | None) -> list[int]:
        return self.tokenizer.encode_tgt(self.text.targets([prefix]))[0] if prefix else []

    def _generator(self, sampling: Sampling | None) -> torch.Generator | None:
        """Sampling's random draws: from its seed, else from a fresh one; None without."""
        if sampling is None:
            return None
        generator = torch.Generator(self.device)
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        generator.manual_seed(seed)
        return generator

    def _decode(
        self,
        src: torch.Tensor,
        opts: DecodeOptions,
        forced: list[int],
        generator: torch.Generator | None,
        on_step: Callable[[int], None] | None,
        compiled: CompiledStep | None,
    ) -> list[list[tuple[list[int], float | None]]]:
        if self.non_autoregressive:
            if opts.nbest > 1 or opts.sampling is not None or forced:
                raise MTError(
                    "model.arch nat decodes by mask-predict: --nbest, --sample and "
                    "--prefix apply to the autoregressive models only"
                )
            return self._mask_predict(src, src == PAD, opts)
        pace = ON_DEVICE if self.searches_on_device else EVERY_STEP
        args = (opts, forced, generator, pace, compiled, on_step, self.never)
        return search(self.model, src, src == PAD, *args)

    def _mask_predict(
        self,
        src: torch.Tensor,
        mask: torch.Tensor,
        opts: DecodeOptions,
        inputs_out: list[list[int]] | None = None,
    ) -> list[list[tuple[list[int], float | None]]]:
        """The non-autoregressive model's decoding (opts.nat_iterations and nat_length_beam);
        inputs_out: see mask_predict."""
        limit = self.model.max_positions - 1
        limit = int(max_lengths(mask, opts.max_len_a, opts.max_len_b, limit).max())
        passes, lengths = opts.nat_iterations, opts.nat_length_beam
        found = mask_predict(self.model, src, mask, passes, lengths, limit, inputs_out=inputs_out)
        return [[(h, None)] for h in found]

    def translate(
        self,
        lines: list[str],
        opts: DecodeOptions | None = None,
        progress: bool = False,
        **given: Any,
    ) -> list[str]:
        """One output per input line, in input order; empty lines give empty outputs. opts:
        the options, else the run's with those given (beam=5, sampling=Sampling(...), ...)."""
        found = self.search(lines, opts, progress, **given)
        return [text[0][0] for text in self.texts_of(found)]

    def translate_nbest(
        self,
        lines: list[str],
        nbest: int,
        opts: DecodeOptions | None = None,
        progress: bool = False,
        **given: Any,
    ) -> list[list[tuple[str, float | None]]]:
        """Per input line, its `nbest` translations with their scores (log-probability over
        length^length_penalty, the beam's ranking), best first; [] for an empty line."""
        opts = (opts or self.options(**given)).with_(nbest=nbest)
        found = self.search(lines, opts, progress)
        return [
            [] if f is None else texts for f, texts in zip(found, self.texts_of(found), strict=True)
        ]

    def texts_of(self, found: list[Found | None]) -> list[list[tuple[str, float | None]]]:
        """The hypotheses of `search` detokenized ([("", None)] for an empty line)."""
        flat = [ids for f in found if f is not None for ids, _ in f[1]]
        it = iter(self.text.outputs(self.tokenizer.decode_tgt(flat)))
        return [
            [("", None)] if f is None else [(next(it), score) for _, score in f[1]] for f in found
        ]

    def alignment_of(self, found: Found, opts: DecodeOptions | None = None) -> tuple[str, str]:
        """(the best translation of a line `search` translated with `opts`, its alignment
        "s-t s-t ...": 0-based source subword to output subword links)."""
        from mt.decode.alignment import format_alignment, hard_alignment

        hyp, weights, eos_row = self._attention_of(found[0], found[1][0][0], opts)
        text = self.text.outputs(self.tokenizer.decode_tgt([hyp]))[0]
        return text, format_alignment(hard_alignment(weights, eos_row))

    def _attention_of(
        self, src_ids: list[int], hyp: list[int], opts: DecodeOptions | None
    ) -> tuple[list[int], Any, bool]:
        """(output, its cross-attention (L, H, T, S), whether the last row is EOS's). A
        search's output is teacher-forced; a NAT's is decoded again alone, keeping the input
        of the pass that produced it (mask_predict's inputs_out), and that output is used."""
        from mt.decode.alignment import cross_attention, nat_cross_attention

        if not self.non_autoregressive:
            return hyp, cross_attention(self.model, src_ids, hyp, self.device), True
        src = torch.tensor([[*src_ids, EOS]], device=self.device)
        inputs: list[list[int]] = []
        opts = opts or self.options()
        (((hyp, _),),) = self._mask_predict(src, src == PAD, opts, inputs_out=inputs)
        return hyp, nat_cross_attention(self.model, src_ids, inputs[0], self.device), False

    def attention(
        self, line: str, beam: int | None = None
    ) -> tuple[str, np.ndarray, list[str], list[str]]:
        """(translation, weights (L, H, T, S), source labels, output labels) for one sentence."""
        found = self.search([line], beam=beam)[0]
        if found is None:
            raise MTError("the sentence is empty: give some text to translate")
        return self.attention_of(found)

    def attention_of(
        self, found: Found, opts: DecodeOptions | None = None
    ) -> tuple[str, np.ndarray, list[str], list[str]]:
        """The same for a line `search` translated with `opts`: (its best translation, the
        cross-attention (L, H, T, S) that produced it, source and output subword labels)."""
        hyp, weights, eos_row = self._attention_of(found[0], found[1][0][0], opts)
        src_labels = [*self.tokenizer.src_pieces_of(found[0]), "</s>"]
        tgt_labels = [*self.tokenizer.tgt_pieces_of(hyp), *(["</s>"] if eos_row else [])]
        text = self.text.outputs(self.tokenizer.decode_tgt([hyp]))[0]
        return text, weights, src_labels, tgt_labels


def _progress_bar(n: int, progress: bool) -> tqdm[Any]:
    """A bar on stderr over `n` sentences, when asked for and stderr is a terminal."""
    return tqdm(
        total=n,
        unit="sent",
        desc="translate",
        file=sys.stderr,
        disable=None if progress and n > 1 else True,
        mininterval=1.0,
    )
