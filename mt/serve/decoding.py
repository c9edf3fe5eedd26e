"""What the server's worker does with a batch of sentences, and what it says about its model:
the same Translator calls as `mt translate`, so a sentence gets the same translation over HTTP
as from the command line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.decode.options import DecodeOptions
from mt.errors import MTError
from mt.serve.batcher import Stopped


@dataclass(frozen=True)
class Settings:
    """A request's decoding options and what it asks to see (hashable: requests with equal
    settings share a batch)."""

    options: DecodeOptions
    alignment: bool = False
    attention: bool = False


def decode_batch(
    translator: Any,
    sentences: list[str],
    settings: Settings,
    stopped: Callable[[], bool] = lambda: False,
) -> list[dict[str, Any]]:
    """One result per sentence: {"text", "score"}, with "nbest" (a list of {"text", "score"}),
    "alignment" and "attention" ({"source", "target", "weights": (L, H, T, S)}) when asked.
    stopped(): checked after every decoder step and every sentence's attention; True raises
    Stopped (nobody waits for the batch any more)."""

    def check(_step: int = 0) -> None:
        if stopped():
            raise Stopped

    opts = settings.options
    found = translator.search(sentences, opts, on_step=check)
    results = []
    for f, hyps in zip(found, translator.texts_of(found), strict=True):
        text, score = hyps[0]
        result: dict[str, Any] = {"text": text, "score": score}
        if opts.nbest > 1:
            result["nbest"] = [] if f is None else [{"text": t, "score": s} for t, s in hyps]
        check()
        if settings.alignment:
            result["alignment"] = "" if f is None else translator.alignment_of(f, opts)[1]
        if settings.attention:
            result["attention"] = None if f is None else _attention(translator, f, opts)
        results.append(result)
    return results


def _attention(translator: Any, found: Any, opts: DecodeOptions) -> dict[str, Any]:
    from mt.decode.alignment import readable_pieces

    _, weights, source, target = translator.attention_of(found, opts)
    return {  # subwords as `mt attention` labels them: "##piece" inside a word
        "source": readable_pieces(source),
        "target": readable_pieces(target),
        "weights": weights.astype(float).round(4).tolist(),  # (layers, heads, target, source)
    }


# what /info says of a model's shape: a Transformer's (False), an RNN's (True)
_SHAPE = {
    False: ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "norm", "positional"),
    True: ("d_model", "enc_layers", "dec_layers", "attention"),
}


def model_info(translator: Any, ckpts: list[dict[str, Any]], paths: list[Path]) -> dict[str, Any]:
    """GET /info: what the server translates with (ckpts: the checkpoints, as loaded)."""
    import torch

    import mt
    from mt.artifacts import checkpoint
    from mt.data.pairs import Languages

    cfg = checkpoint.config_of(ckpts[0], str(paths[0]))
    decode = translator.cfg
    why_not, shape = _why_no_attention(translator, len(ckpts))
    return {
        "mt_version": mt.__version__,
        "models": [f"{p.parent.name}/{p.name}" for p in paths],  # (no path of the machine's)
        "ensemble": len(ckpts) > 1,
        "source_language": cfg.data.src_lang,  # (several pairs: the default direction's)
        "target_language": cfg.data.tgt_lang,
        "pairs": [str(p) for p in Languages.of(cfg.data).pairs],
        "architecture": cfg.model.arch,
        "model": {k: getattr(cfg.model, k) for k in _SHAPE[cfg.model.arch == "rnn"]},
        "parameters": sum(p.numel() for p in translator.model.parameters()),
        "training_steps": [checkpoint.trained_steps(c) for c in ckpts],
        "trained_precision": checkpoint.trained_precision(ckpts[0]),
        "device": str(translator.device),
        "threads": torch.get_num_threads(),  # (torch's intra-op threads on a CPU)
        "decoding": {
            "beam": decode.beam,
            "length_penalty": decode.length_penalty,
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
            **(
                {"nat_iterations": decode.nat_iterations, "nat_length_beam": decode.nat_length_beam}
                if cfg.model.arch == "nat"
                else {}
            ),
        },
        "attention": {"available": why_not is None, "why_not": why_not, "shape": shape},
    }


def _why_no_attention(translator: Any, n_models: int) -> tuple[str | None, list[int] | None]:
    """(None, the weights' [layers, heads]) when `mt attention` can draw this model's
    cross-attention, else (why not, None): one sentence is drawn as `mt attention` would (a
    model without attention, an RNN with model.attention none, says so there)."""
    if n_models > 1:
        return "an ensemble has no single attention to show; serve one model for the picture", None
    try:
        found = translator.search(["a"])
        if found[0] is None:
            return None, None
        weights = translator.attention_of(found[0])[1]
    except MTError as e:
        return str(e), None
    return None, [int(weights.shape[0]), int(weights.shape[1])]
