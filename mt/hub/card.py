"""The model card (README.md) of a run exported for transformers: what the hub shows of it,
generated from the run itself: its data, architecture, training budget, test scores with
sacreBLEU's signatures (or "not evaluated") and the commands that reproduce them, under a
YAML header the hub reads (license, languages, datasets, metrics, base model, model-index).
The license is the user's to give (mt export --license), who alone knows the data's terms.
No local path is written: a card is published."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from mt.artifacts import checkpoint
from mt.data.pairs import Languages, tag
from mt.errors import MTError, shorten
from mt.hub import HUB_ID

_METRICS = (("bleu", "BLEU"), ("chrf", "chrF"), ("chrf_pp", "chrF++"), ("ter", "TER"))


def _train_command(run: Path) -> str:
    """The `mt train` command of the run as run_info.json recorded it (a local path as its
    last part alone), else a generic one."""
    generic = f"mt train CONFIG --run-dir runs/{run.name}"
    try:
        argv = json.loads((run / "run_info.json").read_text(encoding="utf-8"))["argv"]
    except (OSError, ValueError, KeyError, TypeError):
        return generic
    if isinstance(argv, list) and argv[1:2] == ["train"] and all(isinstance(a, str) for a in argv):
        return shlex.join(["mt", *(_published(a) for a in argv[1:])])  # (argv[0]: mt's path)
    return generic


def _published(arg: str) -> str:
    """An argument as a card may show it: an absolute path (or KEY=/abs/path) cut to its
    last part."""
    key, eq, value = arg.rpartition("=")
    return f"{key}{eq}{Path(value).name}" if value.startswith(("/", "~")) else arg


def _cell(text: str) -> str:
    """Text in a Markdown table cell: a | would end the cell (sacreBLEU's signatures hold
    several), so it is escaped, as GitHub's and the hub's tables read it."""
    return text.replace("|", "\\|")


def _tuned(run: Path) -> bool:
    """Whether the run chose its decoding on the valid split (a tuning record in its log)."""
    try:
        text = (run / "train_log.jsonl").read_text(encoding="utf-8")
    except OSError:
        return False
    return '"tuned_decoding"' in text


def _test_set(evaluated: dict) -> str:
    refs = evaluated.get("references") or []
    return Path(str(refs[0])).stem if refs else "a test set"


def _scores(evaluated: dict | None, run: Path, src: str, tgt: str) -> list[str]:
    if evaluated is None:
        return [
            "Not evaluated. Score it on a test set with:",
            "",
            "```bash",
            f"mt eval runs/{run.name} --src test.{src} --ref test.{tgt} --json > scores.json",
            f"mt export runs/{run.name} OUT --format transformers --scores scores.json",
            "```",
        ]
    rows = ["| metric | score | sacreBLEU signature |", "|---|---|---|"]
    for key, label in _METRICS:
        if key in evaluated and f"{key}_signature" in evaluated:
            signature = _cell(str(evaluated[key + "_signature"]))
            rows.append(f"| {label} | {evaluated[key]:.2f} | `{signature}` |")
    return [
        *rows,
        "",
        f"On {_test_set(evaluated)}, scored with `mt eval RUN --src TEST --ref REF --json` on "
        f"the run itself (mt's decoding, its length limit included).",
    ]


def _header(cfg, evaluated: dict | None, license_id: str, name: str) -> str:
    """The card's YAML front matter, written by huggingface_hub's ModelCardData as the hub's
    own tools write it (its model-index from EvalResults)."""
    from huggingface_hub import EvalResult, ModelCardData

    d, m = cfg.data, cfg.model
    evaluated = evaluated or {}
    results = [
        EvalResult(
            task_type="translation",
            task_name=f"Translation {d.src_lang}-{d.tgt_lang}",
            dataset_type=d.dataset or "custom",
            dataset_name=_test_set(evaluated),
            metric_type=key,
            metric_name=label,
            metric_value=round(float(evaluated[key]), 2),
        )
        for key, label in _METRICS
        if key in evaluated
    ]
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="translation",
        license=license_id,
        language=_languages(d),
        tags=["translation", "marian", "mt"],
        datasets=[d.dataset] if d.dataset else [],
        metrics=["bleu", "chrf", "ter"],
        # (a local folder is not a hub model)
        base_model=m.init_from
        if m.init_from and HUB_ID.fullmatch(m.init_from) and not Path(m.init_from).exists()
        else None,
        model_name=name if results else None,
        eval_results=results or None,
    )
    return "---\n" + data.to_yaml() + "\n---"


def _languages(d) -> list[str]:
    """Every language of the run's pairs, the default direction's first."""
    return list(dict.fromkeys([d.src_lang, d.tgt_lang, *Languages.of(d).every]))


def check_license(license_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][\w.+-]{0,63}", license_id):
        raise MTError(
            f"--license {shorten(repr(license_id))}: give a hub license id (e.g. apache-2.0, "
            f"cc-by-4.0, other)"
        )
    return license_id


def model_card(trained, run: Path, out: Path, evaluated: dict | None, license_id="unknown") -> str:
    cfg, d = trained.config, trained.config.data
    lines = [
        _header(cfg, evaluated, license_id, out.name),
        "",
        f"# {Languages.of(d).describe()} translation: a Transformer trained with mt",
        "",
        *_usage(cfg, run, out),
        *_about(trained),
        "## Evaluation",
        "",
        *_scores(evaluated, run, d.src_lang, d.tgt_lang),
        "",
        "## Reproduce",
        "",
        "```bash",
        _train_command(run),
        f"mt export runs/{run.name} {out.name} --format transformers",
        "```",
        "",
    ]
    return "\n".join(lines)


def _usage(cfg, run: Path, out: Path) -> list[str]:
    """How transformers loads and runs the model, and how its search differs from mt's."""
    m = cfg.model
    chosen = (
        "the settings the run chose on its valid split"
        if _tuned(run)
        else "the run's decode settings (not tuned on a valid split)"
    )
    return [
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
        *_tokens_note(cfg),
        f"`generate` searches with beam {cfg.decode.beam} and length penalty "
        f"{cfg.decode.length_penalty} (generation_config.json), {chosen}. It stops a sentence "
        f"at {m.max_positions} tokens (max_length), where mt stops each at "
        f"{cfg.decode.max_len_a:g} x its source length + {cfg.decode.max_len_b}: for the same "
        f"output on a sentence that would run on, pass `max_new_tokens` per batch.",
        "",
    ]


def _tokens_note(cfg) -> list[str]:
    """A model of several target languages: how a source asks for one."""
    langs = Languages.of(cfg.data)
    if not langs.tagged:
        return []
    tokens = ", ".join(f"`{tag(lang)}`" for lang in langs.targets)
    return [
        f"Start each source with the token of the language to translate into ({tokens}; "
        f"OPUS-MT's convention, which MarianTokenizer keeps whole), e.g. "
        f'`">>{langs.targets[0]}<< ..."`. The model was trained on {langs.describe()}.',
        "",
    ]


def _about(trained) -> list[str]:
    """The card's data, architecture and training sections."""
    cfg, tok, model = trained.config, trained.tokenizer, trained.model
    d, m, t = cfg.data, cfg.model, cfg.train
    counters = checkpoint.train_counters(trained.ckpt)
    params = sum(p.numel() for p in model.parameters())
    started = Path(m.init_from).name if m.init_from and Path(m.init_from).exists() else m.init_from
    corpus = d.dataset or "a parallel corpus of the user's"
    origin = [f"- started from {started} (model.init_from), fine-tuned on this corpus"]
    origin = origin if m.init_from else []
    return [
        "## Data",
        "",
        f"- corpus: {corpus}, {Languages.of(d).describe()}; pairs longer than {d.max_len} "
        f"subwords left out",
        f"- vocabulary: sentencepiece, {tok.src_vocab_size} source and {tok.tgt_vocab_size} "
        f"target pieces ({'shared' if tok.shared_ids else 'separate'})",
        *origin,
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
        f"- {counters.get('train_seconds', 0) / 3600:.2f} hours of training, in "
        f"{trained.precision}",
        "",
    ]
