"""An mt Transformer and transformers' `MarianMTModel` compute the same function under other
names, with two differences of layout that the mapping here undoes, exactly:

- The sinusoid. mt interleaves it as the paper writes (PE(pos, 2i) = sin, PE(pos, 2i + 1) =
  cos); Marian puts the sines in the first half of the model dimension and the cosines in the
  second, at the same frequencies. So the model dimension is permuted (`halves`) in every
  weight that reads the residual stream (its columns) or writes it (its rows, and the biases
  and LayerNorm parameters along it). A permutation of the stream commutes with LayerNorm and
  with every position-wise sum, so the function is unchanged.
- The projections. mt's self-attention has one fused Q/K/V matrix and its cross-attention one
  fused K/V matrix (one matmul each); Marian has q_proj, k_proj and v_proj. The heads are laid
  out alike (H blocks of d_head rows), so they are row blocks of mt's matrices.

Token ids are mapped by `order` (mt's id -> Marian's) where a model's vocabulary puts its
special tokens elsewhere than mt does (mt/hub/imports.py); an mt run's own export keeps mt's
ids as they are."""

from __future__ import annotations

import torch

from mt.errors import MTError

# mt's layer sublayers and their Marian names, as (mt name, Marian name, kind); kind says how
# the model dimension enters: "read" (a matrix's columns), "write" (rows or a vector along the
# stream), "inner" (neither: the FFN's hidden bias)
_ATTN = (("out.weight", "out_proj.weight", "write"), ("out.bias", "out_proj.bias", "write"))
_FFN = (
    ("ffn.net.0.weight", "fc1.weight", "read"),
    ("ffn.net.0.bias", "fc1.bias", "inner"),
    ("ffn.net.3.weight", "fc2.weight", "write"),
    ("ffn.net.3.bias", "fc2.bias", "write"),
)


def _norm(mt: str, marian: str) -> tuple[tuple[str, str, str], ...]:
    return (
        (f"{mt}.norm.weight", f"{marian}.weight", "write"),
        (f"{mt}.norm.bias", f"{marian}.bias", "write"),
    )


def _prefixed(mt: str, marian: str, table) -> list[tuple[str, str, str]]:
    return [(f"{mt}{a}", f"{marian}{b}", kind) for a, b, kind in table]


def _layer_table(i: int, decoder: bool) -> list[tuple[str, str, str]]:
    """One layer's one-to-one parameters (the fused projections are handled apart)."""
    side = "decoder" if decoder else "encoder"
    mt, hf = f"{side}.{i}.", f"model.{side}.layers.{i}."
    rows = _prefixed(mt + "self_attn.", hf + "self_attn.", _ATTN)
    rows += _prefixed(mt, hf, _norm("res1", "self_attn_layer_norm") + _FFN)
    if decoder:
        rows += _prefixed(mt + "cross_attn.", hf + "encoder_attn.", _ATTN)
        rows += _prefixed(mt, hf, _norm("res2", "encoder_attn_layer_norm"))
        rows += _prefixed(mt, hf, _norm("res3", "final_layer_norm"))
    else:
        rows += _prefixed(mt, hf, _norm("res2", "final_layer_norm"))
    return rows


def _fused(i: int, decoder: bool) -> list[tuple[str, list[str]]]:
    """(mt's fused projection, the Marian projections stacked in it, in row order)."""
    side = "decoder" if decoder else "encoder"
    mt, hf = f"{side}.{i}.", f"model.{side}.layers.{i}."
    qkv = [f"{hf}self_attn.{p}_proj" for p in "qkv"]
    pairs = [(f"{mt}self_attn.qkv", qkv)]
    if decoder:
        pairs += [(f"{mt}cross_attn.q", [f"{hf}encoder_attn.q_proj"])]
        pairs += [(f"{mt}cross_attn.kv", [f"{hf}encoder_attn.{p}_proj" for p in "kv"])]
    return pairs


def halves(d_model: int) -> torch.Tensor:
    """The permutation p with marian[..., j] = mt[..., p[j]]: the sine features (mt's even
    dimensions) first, then the cosines (its odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _permute(t: torch.Tensor, kind: str, p: torch.Tensor) -> torch.Tensor:
    if kind == "read":
        return t[:, p]
    if kind == "write":
        return t[p]
    return t


def to_marian(state: dict, enc_layers: int, dec_layers: int, tie: str) -> dict:
    """A MarianMTModel state_dict (tied matrices under each of their names, no positions:
    Marian computes them) from an mt Transformer's; `tie`: model.tie_embeddings."""
    d = state["tgt_embed.weight"].shape[1]
    p = halves(d)
    out = {}
    for decoder, n in ((False, enc_layers), (True, dec_layers)):
        for i in range(n):
            for mt, hf, kind in _layer_table(i, decoder):
                out[hf] = _permute(state[mt], kind, p)
            for mt, names in _fused(i, decoder):
                weights = state[f"{mt}.weight"].chunk(len(names), 0)
                biases = state[f"{mt}.bias"].chunk(len(names), 0)
                for name, w, b in zip(names, weights, biases, strict=True):
                    out[f"{name}.weight"], out[f"{name}.bias"] = w[:, p], b
    src, tgt = state["src_embed.weight"][:, p], state["tgt_embed.weight"][:, p]
    out["model.encoder.embed_tokens.weight"] = src
    out["model.decoder.embed_tokens.weight"] = tgt
    if tie == "all":
        out["model.shared.weight"] = src
    out["lm_head.weight"] = state["output.weight"][:, p] if tie == "none" else tgt
    bias = state.get("output_bias", torch.zeros(tgt.shape[0]))
    out["final_logits_bias"] = bias[None, :]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def from_marian(
    marian: dict,
    enc_layers: int,
    dec_layers: int,
    tie: str,
    src_order: torch.Tensor,
    tgt_order: torch.Tensor,
    output_bias: bool,
) -> dict:
    """An mt Transformer's state_dict from a MarianMTModel's: the inverse of `to_marian`, with
    the token ids reordered (`src_order`, `tgt_order`: mt's id -> Marian's; an id may repeat,
    as mt's BOS does Marian's pad where that starts the decoder)."""
    d = marian["model.decoder.embed_tokens.weight"].shape[1]
    q = torch.argsort(halves(d))  # mt[..., j] = marian[..., q[j]]
    out = {}
    for decoder, n in ((False, enc_layers), (True, dec_layers)):
        for i in range(n):
            for mt, hf, kind in _layer_table(i, decoder):
                out[mt] = _permute(marian[hf], kind, q)
            for mt, names in _fused(i, decoder):
                out[f"{mt}.weight"] = torch.cat([marian[f"{x}.weight"][:, q] for x in names])
                out[f"{mt}.bias"] = torch.cat([marian[f"{x}.bias"] for x in names])
    src = marian["model.encoder.embed_tokens.weight"]
    tgt = marian["model.decoder.embed_tokens.weight"]
    out["tgt_embed.weight"] = tgt[tgt_order][:, q]
    if tie != "all":
        out["src_embed.weight"] = src[src_order][:, q]
    else:
        out["src_embed.weight"] = out["tgt_embed.weight"]
    if tie == "none":
        out["output.weight"] = marian["lm_head.weight"][tgt_order][:, q]
    if output_bias:
        out["output_bias"] = marian["final_logits_bias"].reshape(-1)[tgt_order]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def tie_mode(share: bool, tie_output: bool) -> str:
    """mt's model.tie_embeddings for Marian's share_encoder_decoder_embeddings and
    tie_word_embeddings."""
    if share and tie_output:
        return "all"
    if not share:
        return "decoder" if tie_output else "none"
    raise MTError(
        "the model shares its source and target embeddings but keeps its output layer apart "
        "(share_encoder_decoder_embeddings without tie_word_embeddings), which mt cannot hold: "
        "mt ties all three or has the output layer tied to the target side or none"
    )
