"""Load a trained model and translate lines: the one path used by `mt translate`, `mt eval`
and validation during training, so their BLEU scores agree."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm import tqdm

from mt.artifacts import checkpoint
from mt.config import DecodeConfig
from mt.data.batching import pad_sources, token_batches
from mt.data.tokenizer import Tokenizer
from mt.decode.device_search import beam_nbest_on_device, greedy_on_device
from mt.decode.mask_predict import mask_predict
from mt.decode.sampling import Sampling
from mt.decode.search import beam_nbest, greedy, max_lengths, sampler
from mt.errors import MTError
from mt.model import Seq2Seq
from mt.runtime.device import decode_dtype, pick_device
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
    ) -> None:
        """amp_dtype: autocast dtype for the encoder and decoder layers (None: fp32); the output
        layer and log-softmax are fp32 either way (mt.decode.search)."""
        self.model, self.tokenizer, self.cfg, self.device = model, tokenizer, decode_cfg, device
        self.amp_dtype = amp_dtype
        # decode.compile_step: the compiled decoder step and the static caches' buffers, made
        # at the first batch that uses them and kept for the next (their CUDA graphs too)
        self._step_fn: Any = None
        self._pool: Any = None

    @classmethod
    def load(
        cls, paths: str | Path | Sequence[str | Path], device: str = "auto", precision: str = "auto"
    ) -> Translator:
        """A run directory (its best.pt, else last.pt) or checkpoint; several make an ensemble
        that averages the models' log-probabilities at every step (one BPE model required;
        decoding settings and precision from the first)."""
        if isinstance(paths, (str, Path)) or len(paths) == 1:
            return cls.from_checkpoint(
                paths if isinstance(paths, (str, Path)) else paths[0], device, precision
            )
        from mt.decode.ensemble import Ensemble

        resolved = [checkpoint.resolve(p) for p in paths]
        ckpts = [checkpoint.load(p) for p in resolved]
        for path, ckpt in zip(
            resolved[1:], ckpts[1:], strict=True
        ):  # before any is built from them
            if not checkpoint.same_tokenizer(ckpt, ckpts[0]):
                raise MTError(
                    f"{path} uses another BPE model than {resolved[0]}: the models "
                    f"of an ensemble must share one tokenizer (trained on the same "
                    f"data with the same tokenizer config)"
                )
        runs = [checkpoint.trained_from(c, p) for c, p in zip(ckpts, resolved, strict=True)]
        if any(run.config.model.arch == "nat" for run in runs):
            raise MTError(
                "an ensemble decodes autoregressively: model.arch nat runs cannot join one"
            )
        first = cls.from_trained(runs[0], device, precision)
        models = [first.model] + [run.model.to(first.device).eval() for run in runs[1:]]
        return cls(
            Ensemble(models).eval(), first.tokenizer, first.cfg, first.device, first.amp_dtype
        )

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
        return cls(
            run.model.to(dev).eval(),
            run.tokenizer,
            run.config.decode,
            dev,
            decode_dtype(precision, run.precision, dev),
        )

    @property
    def searches_on_device(self) -> bool:
        """decode.device_search: the search of mt/decode/device_search.py (auto: on a GPU)."""
        choice = self.cfg.device_search
        return choice == "always" or (choice == "auto" and self.device.type == "cuda")

    @property
    def compiles_step(self) -> bool:
        """decode.compile_step: the search on the device runs a compiled decoder step over a
        static cache (auto: on a GPU, where CUDA graphs replay it)."""
        choice = self.cfg.compile_step
        on = choice == "always" or (choice == "auto" and self.device.type == "cuda")
        return on and self.searches_on_device and bool(getattr(self.model, "static_cache", False))

    def _static_options(self) -> dict[str, Any]:
        """The search on the device's static cache and compiled step (decode.compile_step),
        one of each per translator, reused by every batch; {} where it does not apply."""
        if not self.compiles_step:
            return {}
        from mt.decode.device_search import compiled_step, with_fallback
        from mt.model.cache import BufferPool

        if self._step_fn is None:
            warn = lambda message: print(message, file=sys.stderr)  # noqa: E731
            self._step_fn = with_fallback(compiled_step(self.device), warn)
        if self._pool is None:
            self._pool = BufferPool()
        return {"static": self._pool, "step_fn": self._step_fn}

    @property
    def non_autoregressive(self) -> bool:
        return bool(getattr(self.model, "non_autoregressive", False))

    def with_options(
        self,
        beam: int | None = None,
        length_penalty: float | None = None,
        nat_iterations: int | None = None,
        nat_length_beam: int | None = None,
    ) -> Translator:
        """This translator with decoding options a user asked for, refused where the model
        does not use them (a beam for mask-predict, mask-predict's knobs for a search): an
        option is never silently ignored. beam and length_penalty only checked here (they are
        passed to translate); the NAT's knobs replace the config's."""
        if self.non_autoregressive and (beam is not None or length_penalty is not None):
            raise MTError(
                "--beam, --greedy and --length-penalty: this model (model.arch nat) decodes by "
                "mask-predict; set --nat-length-beam (candidate lengths) and --nat-iterations"
            )
        nat = {"nat_iterations": nat_iterations, "nat_length_beam": nat_length_beam}
        nat = {k: v for k, v in nat.items() if v is not None}
        if nat and not self.non_autoregressive:
            raise MTError(
                "--nat-iterations and --nat-length-beam apply to model.arch nat runs; this model "
                "searches autoregressively: use --beam and --length-penalty"
            )
        if not nat:
            return self
        cfg = self.cfg.model_copy(update=nat)
        return Translator(self.model, self.tokenizer, cfg, self.device, self.amp_dtype)

    def describe(
        self,
        paths: list[Path],
        options: dict[str, Any],
        nbest: int = 1,
        sampling: Sampling | None = None,
    ) -> str:
        """One line: which model(s) and which decoding settings a translation uses."""
        what = f"an ensemble of {len(paths)} models" if len(paths) > 1 else str(paths[0])
        b = options.get("beam") or self.cfg.beam
        lp = options.get("length_penalty")
        lp = self.cfg.length_penalty if lp is None else lp
        if self.non_autoregressive:
            how = (
                f"mask-predict, {self.cfg.nat_iterations} iterations, "
                f"{self.cfg.nat_length_beam} candidate lengths"
            )
        elif sampling:
            how = (
                f"sampling (temperature {sampling.temperature}, top-k "
                f"{sampling.topk or 'all'}, top-p {sampling.topp}, seed {sampling.seed})"
            )
        else:
            how = "greedy search" if b == 1 else f"beam {b}, length penalty {lp}"
        return (
            f"translating with {what} on {self.device}: {how}"
            + (f", {nbest}-best" if nbest > 1 else "")
            + (f", prefix {options['prefix']!r}" if options.get("prefix") else "")
        )

    def search(
        self,
        lines: list[str],
        beam: int | None = None,
        length_penalty: float | None = None,
        use_cache: bool = True,
        progress: bool = False,
        nbest: int = 1,
        sampling: Sampling | None = None,
        prefix: str | None = None,
    ) -> list[Found | None]:
        """Per input line: (source ids, [(output ids, score), ...] best first: one, or
        `nbest` from beam search; the score is None for greedy search and sampling), or None
        for an empty line; input order. progress: a bar on stderr when it is a terminal."""
        beam = beam or self.cfg.beam
        if nbest > beam and sampling is None:
            raise MTError(f"--nbest {nbest} needs a beam of at least {nbest} (it is {beam})")
        texts = [" ".join(line.split()) for line in lines]
        todo = [i for i, t in enumerate(texts) if t]
        ids = self._source_ids([texts[i] for i in todo])
        forced = self.tokenizer.encode_tgt([prefix])[0] if prefix else []
        generator = self._generator(sampling)
        out: list[Found | None] = [None] * len(lines)
        lens = np.array([len(x) + 1 for x in ids], dtype=np.int64)
        bar = _progress_bar(len(ids), progress)
        # Sorted by length (no shuffling) so each batch has little padding.
        for batch in token_batches(lens, np.zeros_like(lens), self.cfg.max_tokens, seed=None):
            src = pad_sources([np.asarray(ids[i], dtype=np.int64) for i in batch]).to(self.device)
            with torch.autocast(
                self.device.type,
                dtype=self.amp_dtype or torch.float32,
                enabled=self.amp_dtype is not None,
            ):
                hyps = self._decode(
                    src,
                    src == PAD,
                    beam,
                    length_penalty,
                    nbest,
                    sampling,
                    generator,
                    forced,
                    use_cache,
                )
            for i, hyp in zip(batch, hyps, strict=True):
                out[todo[i]] = (ids[i], hyp)
            bar.update(len(batch))
        bar.close()
        return out

    def _source_ids(self, texts: list[str]) -> list[list[int]]:
        ids = self.tokenizer.encode_src(texts)
        limit = self.model.max_positions - 1
        n_long = sum(len(x) > limit for x in ids)
        if n_long:
            print(
                f"warning: {n_long} input line(s) longer than {limit} subwords were truncated",
                file=sys.stderr,
            )
        return [x[:limit] for x in ids]

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
        mask: torch.Tensor,
        beam: int,
        length_penalty: float | None,
        nbest: int,
        sampling: Sampling | None,
        generator: torch.Generator | None,
        forced: list[int],
        use_cache: bool,
    ) -> list[list[tuple[list[int], float | None]]]:
        c = self.cfg
        if getattr(self.model, "non_autoregressive", False):
            if nbest > 1 or sampling is not None or forced:
                raise MTError(
                    "model.arch nat decodes by mask-predict: --nbest, --sample and "
                    "--prefix apply to the autoregressive models only"
                )
            return self._mask_predict(src, mask)
        lp = c.length_penalty if length_penalty is None else length_penalty
        lengths = (c.max_len_a, c.max_len_b)
        static = self._static_options()
        if self.searches_on_device and sampling is not None:
            draw = sampler(sampling.temperature, sampling.topk, sampling.topp, generator)
            hyps = greedy_on_device(self.model, src, mask, *lengths, use_cache, pick=draw,
                                    forced=forced, **static)  # fmt: skip
            return [[(h, None)] for h in hyps]
        if self.searches_on_device:  # greedy too: beam 1 is greedy
            found = beam_nbest_on_device(
                self.model, src, mask, beam, nbest, lp, *lengths, use_cache, forced=forced,
                **static,
            )  # fmt: skip
            if beam == 1:  # greedy's outputs carry no score
                return [[(h, None) for h, _ in hyps] for hyps in found]
            return cast(list[list[tuple[list[int], float | None]]], found)
        if sampling is not None or (beam == 1 and nbest == 1):
            s = sampling
            pick = None if s is None else sampler(s.temperature, s.topk, s.topp, generator)
            hyps = greedy(self.model, src, mask, *lengths, use_cache, pick=pick, forced=forced)
            return [[(h, None)] for h in hyps]
        found = beam_nbest(
            self.model, src, mask, beam, nbest, lp, *lengths, use_cache, forced=forced
        )
        return cast(list[list[tuple[list[int], float | None]]], found)  # (never None in beams)

    def _mask_predict(
        self, src: torch.Tensor, mask: torch.Tensor, inputs_out: list[list[int]] | None = None
    ) -> list[list[tuple[list[int], float | None]]]:
        """The non-autoregressive model's decoding (decode.nat_iterations and
        nat_length_beam); inputs_out: see mask_predict."""
        c = self.cfg
        limit = int(max_lengths(mask, c.max_len_a, c.max_len_b, self.model.max_positions - 1).max())
        found = mask_predict(
            self.model, src, mask, c.nat_iterations, c.nat_length_beam, limit, inputs_out=inputs_out
        )
        return [[(h, None)] for h in found]

    def translate(
        self,
        lines: list[str],
        beam: int | None = None,
        length_penalty: float | None = None,
        use_cache: bool = True,
        progress: bool = False,
        sampling: Sampling | None = None,
        prefix: str | None = None,
    ) -> list[str]:
        """One output per input line, in input order; empty lines give empty outputs."""
        found = self.search(
            lines, beam, length_penalty, use_cache, progress, sampling=sampling, prefix=prefix
        )
        return [text[0][0] for text in self.texts_of(found)]

    def translate_nbest(
        self,
        lines: list[str],
        nbest: int,
        beam: int | None = None,
        length_penalty: float | None = None,
        progress: bool = False,
        prefix: str | None = None,
    ) -> list[list[tuple[str, float | None]]]:
        """Per input line, its `nbest` translations with their scores (log-probability over
        length^length_penalty, the beam's ranking), best first; [] for an empty line."""
        found = self.search(
            lines, beam, length_penalty, progress=progress, nbest=nbest, prefix=prefix
        )
        return [
            [] if f is None else texts for f, texts in zip(found, self.texts_of(found), strict=True)
        ]

    def texts_of(self, found: list[Found | None]) -> list[list[tuple[str, float | None]]]:
        """The hypotheses of `search` detokenized ([("", None)] for an empty line)."""
        flat = [ids for f in found if f is not None for ids, _ in f[1]]
        it = iter(self.tokenizer.decode_tgt(flat))
        return [
            [("", None)] if f is None else [(next(it), score) for _, score in f[1]] for f in found
        ]

    def translate_lines(
        self,
        lines: list[str],
        options: dict[str, Any],
        nbest: int = 1,
        sampling: Sampling | None = None,
        alignment: bool = False,
    ) -> list[str]:
        """The output lines of `mt translate`: translations, n-best rows
        (LINE TAB SCORE TAB TEXT) or translations with their alignment."""
        if alignment:
            return self.translate_with_alignment(lines, options["beam"], options["length_penalty"])
        if nbest > 1:
            return [
                f"{i}\t{score:.4f}\t{text}"
                for i, hyps in enumerate(
                    self.translate_nbest(lines, nbest, progress=True, **options)
                )
                for text, score in hyps
            ]
        return self.translate(lines, **options, sampling=sampling, progress=True)

    def translate_with_alignment(
        self, lines: list[str], beam: int | None = None, length_penalty: float | None = None
    ) -> list[str]:
        """ "translation<TAB>s-t s-t ...": 0-based source-subword to output-subword links."""
        out = []
        for found in self.search(lines, beam, length_penalty):
            out.append("\t" if found is None else "\t".join(self.alignment_of(found)))
        return out

    def alignment_of(self, found: Found) -> tuple[str, str]:
        """(the best translation of a line `search` translated, its alignment "s-t s-t ...":
        0-based source subword to output subword links)."""
        from mt.decode.alignment import format_alignment, hard_alignment

        hyp, weights, eos_row = self._attention_of(found[0], found[1][0][0])
        text = self.tokenizer.decode_tgt([hyp])[0]
        return text, format_alignment(hard_alignment(weights, eos_row))

    def _attention_of(self, src_ids: list[int], hyp: list[int]) -> tuple[list[int], Any, bool]:
        """(output, its cross-attention (L, H, T, S), whether the last row is EOS's). A
        search's output is teacher-forced; a NAT's is decoded again alone, keeping the input
        of the pass that produced it (mask_predict's inputs_out), and that output is used."""
        from mt.decode.alignment import cross_attention, nat_cross_attention

        if not self.non_autoregressive:
            return hyp, cross_attention(self.model, src_ids, hyp, self.device), True
        src = torch.tensor([[*src_ids, EOS]], device=self.device)
        inputs: list[list[int]] = []
        (((hyp, _),),) = self._mask_predict(src, src == PAD, inputs_out=inputs)
        return hyp, nat_cross_attention(self.model, src_ids, inputs[0], self.device), False

    def attention(
        self, line: str, beam: int | None = None
    ) -> tuple[str, np.ndarray, list[str], list[str]]:
        """(translation, weights (L, H, T, S), source labels, output labels) for one sentence."""
        found = self.search([line], beam)[0]
        if found is None:
            raise MTError("the sentence is empty: give some text to translate")
        return self.attention_of(found)

    def attention_of(self, found: Found) -> tuple[str, np.ndarray, list[str], list[str]]:
        """The same for a line `search` translated: (its best translation, the cross-attention
        (L, H, T, S) that produced it, source and output subword labels)."""
        hyp, weights, eos_row = self._attention_of(found[0], found[1][0][0])
        src_labels = [self.tokenizer.src.IdToPiece(i) for i in found[0]] + ["</s>"]
        tgt_labels = [*self.tokenizer.tgt_pieces_of(hyp), *(["</s>"] if eos_row else [])]
        return self.tokenizer.decode_tgt([hyp])[0], weights, src_labels, tgt_labels


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
