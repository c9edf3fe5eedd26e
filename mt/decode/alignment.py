"""Cross-attention you can look at: the weights the decoder put on each source subword while
producing each output subword, as a heat map or as a hard alignment for scripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mt.outputs import atomic_file, picture_format
from mt.tokens import BOS, EOS


@torch.no_grad()
def cross_attention(
    model, src_ids: list[int], hyp_ids: list[int], device: torch.device
) -> np.ndarray:
    """Teacher-force the hypothesis and collect every decoder layer's cross-attention
    (an RNN has one layer and one head; a decoder-only model gives its target-to-source part):
    (layers, heads, T, S), row t = the step that produced output token t (the last one is EOS),
    column s = source token s (the last one is EOS). The same states as during search: the
    incremental decoder computes exactly what a full pass over the same prefix computes."""
    src = torch.tensor([[*src_ids, EOS]], device=device)
    tgt_in = torch.tensor([[BOS, *hyp_ids]], device=device)
    pad_mask = torch.zeros_like(src, dtype=torch.bool)
    weights: list[torch.Tensor] = []
    model.decode(tgt_in, model.encode(src, pad_mask), pad_mask, weights=weights)
    if not weights:
        from mt.errors import MTError

        raise MTError(
            "this model has no attention to show (model.attention: none reads one "
            "fixed summary of the source); train with attention bahdanau or luong"
        )
    return torch.cat(weights).float().cpu().numpy()  # (L, H, T, S)


@torch.no_grad()
def nat_cross_attention(
    model, src_ids: list[int], decoder_input: list[int], device: torch.device
) -> np.ndarray:
    """A non-autoregressive model's cross-attention in the pass that produced its output (the
    decoder reading `decoder_input`, mask_predict's last input with its re-masked tokens):
    (layers, heads, T, S), row t = output token t (there is no EOS row: the length was
    predicted), column s = source token s (the last one is EOS)."""
    src = torch.tensor([[*src_ids, EOS]], device=device)
    tgt = torch.tensor([decoder_input], device=device)
    pad_mask = torch.zeros_like(src, dtype=torch.bool)
    weights: list[torch.Tensor] = []
    model.decode(tgt, model.encode(src, pad_mask), pad_mask, weights=weights)
    return torch.cat(weights).float().cpu().numpy()  # (L, H, T, S)


def hard_alignment(weights: np.ndarray, eos_row: bool = True) -> list[tuple[int, int]]:
    """(source index, target index) pairs, 0-based over subwords: for each output token (EOS
    excluded: the last row, where there is one), the source token (EOS excluded) that the
    heads of the last layer, averaged, attend to most."""
    avg = weights[-1].mean(0)[: -1 if eos_row else None, :-1]  # (T, S-1)
    if avg.size == 0:
        return []
    return [(int(s), t) for t, s in enumerate(avg.argmax(1))]


def format_alignment(pairs: list[tuple[int, int]]) -> str:
    return " ".join(f"{s}-{t}" for s, t in pairs)


def plot_attention(
    weights: np.ndarray,
    src_labels: list[str],
    tgt_labels: list[str],
    out: Path,
    layer: int | None = None,
    head: int | None = None,
    grid: bool = False,
    title: str = "",
) -> Path:
    """Draw attention_figure into `out`, in the format its name ends in (PNG, SVG, PDF...)."""
    import matplotlib.pyplot as plt

    fig = attention_figure(weights, src_labels, tgt_labels, layer, head, grid, title)
    with atomic_file(out) as f:
        fig.savefig(f, format=picture_format(out), dpi=110)
    plt.close(fig)
    return out


def attention_figure(
    weights: np.ndarray,
    src_labels: list[str],
    tgt_labels: list[str],
    layer: int | None = None,
    head: int | None = None,
    grid: bool = False,
    title: str = "",
):
    """Cross-attention heat maps: the mean over layers and heads, one layer/head, or a grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels, rows, cols = _panels(weights, layer, head, grid)
    src_labels, tgt_labels = readable_pieces(src_labels), readable_pieces(tgt_labels)
    cell = 0.32
    fig, axes = plt.subplots(
        rows,
        cols,
        squeeze=False,
        figsize=(
            max(5.0, cols * (len(src_labels) * cell + 2.5)),
            max(3.5, rows * (len(tgt_labels) * cell + 2.0)),
        ),
    )
    for ax, (name, m) in zip(axes.flat, panels, strict=True):
        # scaled to the panel's own largest weight, so diffuse attention (all weights small)
        # still shows its pattern; the colorbar gives the real values
        image = ax.imshow(m, cmap="Greys", vmin=0.0, vmax=max(float(m.max()), 1e-6), aspect="auto")
        ax.set_xticks(range(len(src_labels)), src_labels, rotation=90, fontsize=8)
        ax.set_yticks(range(len(tgt_labels)), tgt_labels, fontsize=8)
        ax.set_xlabel("source subwords", fontsize=8)
        ax.set_ylabel("output subwords", fontsize=8)
        ax.set_title(name, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label(
            "attention weight", fontsize=8
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def readable_pieces(pieces: list[str]) -> list[str]:
    """sentencepiece marks a word's first piece with "▁"; on a plot, a word-initial piece is
    shown as it is and a piece inside a word gets "##" (BERT's convention)."""
    out = []
    for p in pieces:
        if p.startswith("\u2581"):
            out.append(p[1:] or "\u2423")  # a lone "▁" is a space: show it as "␣"
        elif p.startswith("<") and p.endswith(">"):
            out.append(p)
        else:
            out.append("##" + p)
    return out


def _panels(weights: np.ndarray, layer: int | None, head: int | None, grid: bool):
    """([(title, (T, S) weights)], rows, cols): every layer and head, or one panel of the
    chosen layer/head (their mean where none is chosen)."""
    n_layers, n_heads = weights.shape[:2]
    if grid:
        panels = [
            (f"layer {i + 1} head {j + 1}", weights[i, j])
            for i in range(n_layers)
            for j in range(n_heads)
        ]
        rows, cols = n_layers, n_heads
    else:
        sel = weights if layer is None else weights[layer - 1 : layer]
        sel = sel if head is None else sel[:, head - 1 : head]
        what = (
            ("all layers" if layer is None else f"layer {layer}")
            + ", "
            + ("mean of heads" if head is None else f"head {head}")
        )
        panels, rows, cols = [(what, sel.mean((0, 1)))], 1, 1
    return panels, rows, cols
