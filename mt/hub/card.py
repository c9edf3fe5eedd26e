"""The model card (README.md) of a run exported for transformers: what the hub shows of it,
generated from the run itself: its data, architecture, training budget, test scores with
sacreBLEU's signatures (or "not evaluated") and the commands that reproduce them. The license
is left for the user, who alone knows the data's terms."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from mt.artifacts import checkpoint

_METRICS = (("bleu", "BLEU"), ("chrf", "chrF"), ("chrf_pp", "chrF++"), ("ter", "TER"))


def _train_command(run: Path) -> str:
    """The `mt train` command of the run as run_info.json recorded it, else a generic one."""
    try:
        argv = json.loads((run / "run_info.json").read_text(encoding="utf-8"))["argv"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"mt train CONFIG --run-dir {run}"
    if isinstance(argv, list) and argv[1:2] == ["train"] and all(isinstance(a, str) for a in argv):
        return shlex.join(["mt", *argv[1:]])  # (argv[0]: the mt program's path)
    return f"mt train CONFIG --run-dir {run}"


def _scores(evaluated: dict | None, run: Path, src: str, tgt: str) -> list[str]:
    if evaluated is None:
        return [
            "Not evaluated. Score it on a test set with:",
            "",
            "```bash",
            f"mt eval {run} --src test.{src} --ref test.{tgt} --json > scores.json",
            f"mt export {run} OUT --format transformers --scores scores.json",
            "```",
        ]
    rows = ["| metric | score | sacreBLEU signature |", "|---|---|---|"]
    for key, label in _METRICS:
        if key in evaluated and f"{key}_signature" in evaluated:
            rows.append(f"| {label} | {evaluated[key]:.2f} | `{evaluated[key + '_signature']}` |")
    return [*rows, "", "Scored with `mt eval RUN --src TEST --ref REF --json` on the run itself."]


def model_card(trained, run: Path, out: Path, evaluated: dict | None) -> str:
    cfg, tok, model = trained.config, trained.tokenizer, trained.model
    d, m, t = cfg.data, cfg.model, cfg.train
    counters = checkpoint.train_counters(trained.ckpt)
    params = sum(p.numel() for p in model.parameters())
    corpus = d.dataset or "a parallel corpus of the user's"
    hours = counters.get("train_seconds", 0) / 3600
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: translation",
        f"language: [{d.src_lang}, {d.tgt_lang}]",
        "tags: [translation, marian, mt]",
        "license: # the license of this model and of its training data: fill it in",
        "---",
        "",
        f"# {d.src_lang}-{d.tgt_lang} translation: a Transformer trained with mt",
        "",
        "A `MarianMTModel` that `transformers` loads on its own:",
        "",
        "```python",
        "from transformers import MarianMTModel, MarianTokenizer",
        "",
        f'tokenizer = MarianTokenizer.from_pretrained("{out.name}")',
        f'model = MarianMTModel.from_pretrained("{out.name}")',
        'batch = tokenizer(["..."], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```",
        "",
        f"`generate` searches with beam {cfg.decode.beam} and length penalty "
        f"{cfg.decode.length_penalty} (generation_config.json), the settings the run chose on "
        f"its valid split.",
        "",
        "## Data",
        "",
        f"- corpus: {corpus}, {d.src_lang} -> {d.tgt_lang}; pairs longer than {d.max_len} "
        f"subwords left out",
        f"- vocabulary: sentencepiece, {tok.src_vocab_size} source and {tok.tgt_vocab_size} "
        f"target pieces ({'shared' if tok.shared_ids else 'separate'})",
        *(
            [f"- started from {m.init_from} (model.init_from), fine-tuned on this corpus"]
            if m.init_from
            else []
        ),
        "",
        "## Architecture",
        "",
        f"Transformer encoder-decoder (post-LN, sinusoidal positions): {m.enc_layers} + "
        f"{m.dec_layers} layers, d_model {m.d_model}, {m.n_heads} heads, feed-forward "
        f"{m.d_ff} ({m.activation}), embeddings tied: {m.tie_embeddings}; {params:,} parameters.",
        "",
        "## Training",
        "",
        f"- {counters.get('step', 0):,} updates of about {t.max_tokens:,} tokens each "
        f"({counters.get('epoch', 0)} epochs), Adam with the inverse-square-root schedule "
        f"({t.warmup} warmup steps), label smoothing {t.label_smoothing}, dropout {m.dropout}",
        f"- {hours:.2f} hours of training, in {trained.precision}",
        "",
        "## Evaluation",
        "",
        *_scores(evaluated, run, d.src_lang, d.tgt_lang),
        "",
        "## Reproduce",
        "",
        "```bash",
        _train_command(run),
        f"mt export {run} {out.name} --format transformers",
        "```",
        "",
    ]
    return "\n".join(lines)
