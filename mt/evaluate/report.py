"""`mt report RUN_DIR -o report.html`: one self-contained HTML page about a run: its config,
training curves, validation over time, the decoding tuning grid, test scores with confidence
intervals, attention pictures, the best and worst translations by sentence BLEU, and with a
baseline run, the significance table. Pictures are embedded, so the file travels alone."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import yaml

from mt.artifacts import checkpoint, members
from mt.data.corpus import has_split, read_lines, split_paths
from mt.data.pairs import Languages, tagged
from mt.errors import MTError
from mt.evaluate.metrics import full_scores, paired_significance
from mt.evaluate.plot import read_log

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}pre{background:#f8f8f8;padding:.8em;
overflow-x:auto}img{max-width:100%}.small{color:#666;font-size:.9em}td.num{text-align:right}"""


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v) -> str:
    if isinstance(v, float):
        return f'<td class="num">{v:.2f}</td>'
    return f"<td>{html.escape('' if v is None else str(v))}</td>"


def _curves(run_dir: Path) -> str:
    from mt.evaluate.plot import training_figure

    return _png(training_figure(run_dir))


def _validation(records: list[dict]) -> str:
    """The validations: BLEU (several pairs: train.best_by's, and each pair's), chrF."""
    pairs = list(next((r["valid_bleu_pairs"] for r in records if "valid_bleu_pairs" in r), {}))
    rows = [
        {
            "step": r["step"],
            "valid loss": r.get("valid_loss"),
            "BLEU": r["valid_bleu"],
            **{p: r.get("valid_bleu_pairs", {}).get(p) for p in pairs},
            "chrF": r.get("valid_chrf"),
            "": "average of snapshots"
            if "averaged" in r
            else ("best so far" if r.get("best") else ""),
        }
        for r in records
        if "valid_bleu" in r
    ]
    return (
        _table(rows, ["step", "valid loss", "BLEU", *pairs, "chrF", ""])
        if rows
        else "<p>The run has not validated yet.</p>"
    )


def _tuning(records: list[dict]) -> str:
    tuned = [r for r in records if "grid" in r]
    if not tuned:
        return "<p>No decoding tuning in this run (decode.tune_beams is empty).</p>"
    rec = tuned[-1]
    best = rec["tuned_decoding"]
    keys = [k for k in rec["grid"][0] if k != "valid_bleu"]
    rows = [
        {
            **{k.replace("_", " "): g[k] for k in keys},
            "valid BLEU": g["valid_bleu"],
            "": "chosen" if all(g[k] == best[k] for k in keys) else "",
        }
        for g in rec["grid"]
    ]
    return _table(rows, [k.replace("_", " ") for k in keys] + ["valid BLEU", ""])


def _scores(scores: dict, n: int, source: str) -> str:
    rows = [
        {
            "metric": name,
            "score": scores[key],
            "bootstrap mean": scores.get(key + "_mean"),
            "95% CI ±": scores.get(key + "_ci"),
            "signature": scores[key + "_signature"],
        }
        for key, name in (("bleu", "BLEU"), ("chrf", "chrF"), ("chrf_pp", "chrF++"), ("ter", "TER"))
    ]
    return (
        f"<p class='small'>{n} sentences of {html.escape(source)}, sacreBLEU, "
        f"1,000 bootstrap resamples</p>"
        + _table(rows, ["metric", "score", "bootstrap mean", "95% CI ±", "signature"])
    )


def _samples(src: list[str], hyps: list[str], refs: list[str], k: int = 5) -> str:
    import sacrebleu

    scored = sorted(
        range(len(hyps)), key=lambda i: sacrebleu.sentence_bleu(hyps[i], [refs[i]]).score
    )
    out = []
    for title, idx in (("best", scored[::-1][:k]), ("worst", scored[:k])):
        rows = [
            {
                "sentence BLEU": sacrebleu.sentence_bleu(hyps[i], [refs[i]]).score,
                "source": src[i],
                "translation": hyps[i],
                "reference": refs[i],
            }
            for i in idx
        ]
        out.append(
            f"<h3>The {k} {title} by sentence BLEU</h3>"
            + _table(rows, ["sentence BLEU", "source", "translation", "reference"])
        )
    return "".join(out)


def _attention(translator, sentences: list[str]) -> str:
    from mt.decode.alignment import attention_figure

    pictures = []
    for line in sentences:
        try:
            text, weights, src_labels, tgt_labels = translator.attention(line)
        except MTError as e:  # e.g. an RNN without attention
            return f"<p>{html.escape(str(e))}</p>"
        pictures.append(
            _png(attention_figure(weights, src_labels, tgt_labels, title=f"{line}\n-> {text}"))
        )
    return "".join(pictures)


def build_report(
    run_dir: Path,
    baseline: Path | None = None,
    src: Path | None = None,
    refs: list[Path] | None = None,
    device: str = "cpu",
) -> str:
    """The HTML page (a string); translating the test split takes most of the time. A run of
    several members (train.members): each member's training, and the ensemble's tuning and
    test scores."""
    from mt.decode.translator import Translator

    dirs = members.member_dirs(run_dir)
    run = checkpoint.open_trained((dirs or [run_dir])[0])
    cfg = run.config
    tests = _test_sets(cfg, src, refs)
    parts = [f"<h1>mt run {html.escape(run_dir.name)}</h1>"]
    for d in dirs or [run_dir]:
        parts += _training_sections(d, d.name if dirs else "")
    if dirs:
        parts += ["<h2>The ensemble's decoding, tuned on the valid split</h2>", _tuning_of(run_dir)]
    translator = Translator.load(run_dir, device) if dirs else Translator.from_trained(run, device)
    if not tests:
        parts.append(
            f"<h2>Test scores</h2><p>No test split in {html.escape(cfg.data.dir)}: pass "
            f"--src and --ref.</p>"
        )
    for title, lang, test_src, test_refs in tests:
        parts += [f"<h2>{html.escape(title)}</h2>"] if title else []
        parts += _test_sections(translator, run_dir, test_src, test_refs, baseline, device, lang)
    config = yaml.safe_dump(checkpoint.config_dict(run.ckpt), sort_keys=False)
    parts += ["<h2>Config</h2>", f"<pre>{html.escape(config)}</pre>"]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mt run "
        f"{html.escape(run_dir.name)}</title><style>{CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )


def _training_sections(run_dir: Path, member: str) -> list[str]:
    """One run's (or member's) checkpoint, curves, validations and tuning."""
    records, path = read_log(run_dir), checkpoint.resolve(run_dir)
    of = f": {html.escape(member)}" if member else ""
    step = checkpoint.train_counters(checkpoint.load(path)).get("step", "?")
    return [
        f"<p class='small'>{html.escape(str(path))}, step {step}</p>",
        f"<h2>Training curves{of}</h2>",
        _curves(run_dir),
        f"<h2>Validation{of}</h2>",
        _validation(records),
        f"<h2>Decoding tuned on the valid split{of}</h2>",
        _tuning(records),
    ]


def _tuning_of(run_dir: Path) -> str:
    """The ensemble's tuning grid (RUN_DIR/ensemble.json)."""
    found = members.manifest(run_dir) or {}
    tuning = found.get("tuning")
    if not tuning:
        return "<p>Not tuned yet (mt tune RUN_DIR).</p>"
    best = {**found["decoding"], "valid_bleu": tuning["valid_bleu"]}
    return _tuning([{"grid": tuning["grid"], "tuned_decoding": best}])


def _paired_rows(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """paired_significance's rows as `mt eval` prints them: scores with 2 decimals, p-values
    with 4 ("baseline" on its own row), under readable column names."""
    out, columns = [], ["system"]
    for name in ("BLEU", "chrF"):
        columns += [name, f"{name} mean ± 95% CI", f"{name} p (bootstrap)", f"{name} p (AR)"]
    for i, r in enumerate(rows):
        row = {"system": r["system"]}
        for metric, name in (("bleu", "BLEU"), ("chrf", "chrF")):
            row[name] = r[metric]
            row[f"{name} mean ± 95% CI"] = f"{r[metric + '_mean']:.2f} ± {r[metric + '_ci']:.2f}"
            bs, ar = (
                ("baseline", "")
                if i == 0
                else (f"{r[metric + '_p_bs']:.4f}", f"{r[metric + '_p_ar']:.4f}")
            )
            row[f"{name} p (bootstrap)"], row[f"{name} p (AR)"] = bs, ar
        out.append(row)
    return out, columns


def _test_sets(cfg, src: Path | None, refs: list[Path] | None) -> list[tuple]:
    """[(title, target-language token, source, references)]: the ones given, else the run's
    test split, every pair's (a title each where there are several)."""
    if src is not None:
        return [("", None, src, refs or [])]
    langs = Languages.of(cfg.data)
    several = len(langs.pairs) > 1
    return [
        (str(p) if several else "", langs.tag_of(p), *_test_split(cfg.data.dir, p))
        for p in langs.pairs
        if has_split(cfg.data.dir, "test", p.src, p.tgt)
    ]


def _test_split(folder: str, pair) -> tuple[Path, list[Path]]:
    src, ref = split_paths(folder, "test", pair.src, pair.tgt)
    return src, [ref]


def _test_sections(
    translator,
    run_dir: Path,
    src: Path,
    ref: list[Path],
    baseline: Path | None,
    device: str,
    lang: str | None = None,
) -> list[str]:
    """The test set's scores, attention pictures and translations, and the paired tests
    against a baseline run when one is given; lang: the target language whose token leads
    the sources (a model of several pairs)."""
    from mt.decode.translator import Translator
    from mt.evaluate.compare import references

    if not ref:
        raise MTError("--src needs --ref: the references to score against")
    src_lines, refs = tagged(read_lines(src), lang), references(ref)
    hyps = translator.translate(src_lines)
    parts = [
        "<h2>Test scores</h2>",
        _scores(full_scores(hyps, refs, 1000), len(hyps), str(src)),
        "<h2>Attention</h2>",
        _attention(translator, [s for s in src_lines if s][:2]),
        "<h2>Translations</h2>",
        _samples(src_lines, hyps, refs[0]),
    ]
    if baseline is not None:
        base = Translator.load(baseline, device).translate(src_lines)
        systems = [(f"baseline {baseline}", base), (f"this run {run_dir}", hyps)]
        rows, columns = _paired_rows(paired_significance(systems, refs))
        parts += [
            "<h2>Against the baseline</h2>",
            _table(rows, columns),
            "<p class='small'>p: the probability of a difference at least this large by chance "
            "(paired bootstrap, 1,000 resamples; approximate randomisation, 10,000 trials)</p>",
        ]
    return parts
