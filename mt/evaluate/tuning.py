"""Choose the decoding settings on the validation split, never on a test set, and store them
in best.pt so that `mt translate RUN_DIR` uses them: beam size and length penalty for a
search, candidate lengths and iterations for mask-predict (model.arch nat)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mt.artifacts import checkpoint
from mt.decode.translator import Translator
from mt.evaluate.metrics import pair_scores
from mt.outputs import check_not_training


def decoding_grid(
    translator: Translator,
    beams: Sequence[int],
    penalties: Sequence[float],
    nat_length_beams: Sequence[int] = (),
    nat_iterations: Sequence[int] = (),
) -> list[dict]:
    """The settings to try, each a dict of decode keys: beams x length penalties for a search
    (beam 1 is greedy, where the penalty plays no part), or mask-predict's candidate lengths x
    iterations for a NAT model (its iterations default to the config's)."""
    if translator.non_autoregressive:
        its = list(nat_iterations) or [translator.cfg.nat_iterations]
        return [
            {"nat_length_beam": lb, "nat_iterations": t} for lb in nat_length_beams for t in its
        ]
    return [
        {"beam": beam, "length_penalty": lp}
        for beam in beams
        for lp in (penalties if beam > 1 else [translator.cfg.length_penalty])
    ]


def _cost(settings: dict) -> tuple:
    """Among equal scores the cheaper wins: the smaller beam, then the penalty nearer 1; for
    mask-predict fewer iterations, then fewer candidate lengths."""
    if "beam" in settings:
        return (-settings["beam"], -abs(settings["length_penalty"] - 1))
    return (-settings["nat_iterations"], -settings["nat_length_beam"])


def translate_with(translator: Translator, src: list[str], settings: dict) -> list[str]:
    return translator.translate(src, **settings)


def tune_decoding(
    translator: Translator, src: list[str], grid: list[dict], bleu: Callable[[list[str]], float]
) -> dict:
    """Translate the validation source with every settings dict of `grid` (decoding_grid) and
    keep the highest BLEU (ties: the cheaper, _cost); bleu(translations): the BLEU to follow
    (pair_scores': the corpus's, or with several pairs train.best_by's). Returns the record
    for train_log.jsonl: {"tuned_decoding": best, "grid": [...]}, each with its valid_bleu."""
    scored = [{**g, "valid_bleu": round(bleu(translate_with(translator, src, g)), 2)} for g in grid]
    best = max(scored, key=lambda g: (g["valid_bleu"], *_cost(g)))
    return {"tuned_decoding": best, "grid": scored}


def describe_settings(settings: dict) -> str:
    if "beam" in settings:
        return f"beam {settings['beam']}, length penalty {settings['length_penalty']}"
    return (
        f"mask-predict, {settings['nat_iterations']} iterations, "
        f"{settings['nat_length_beam']} candidate lengths"
    )


def tuning_pairs(cfg, src: Path | None, ref: Path | None) -> tuple[list, list, tuple]:
    """The tuning sentences: `src` and `ref`, or the run's valid split (cfg: best.pt's
    config; several language pairs: every pair's, each source led by its token, as
    validation reads them); pairs with an empty side dropped. Returns (sources, references,
    ((pair, lines), ...) for several pairs of the valid split, else ())."""
    from mt.data.corpus import Stats, drop_empty, read_parallel
    from mt.data.pairs import Languages, tagged
    from mt.data.prepare import read_valid
    from mt.data.textform import text_form
    from mt.errors import MTError

    if src is None and ref is None:
        vsrc, vrefs, pairs = read_valid(cfg, Stats())
        return vsrc, text_form(cfg.data).references(vrefs), pairs
    if ref is None or src is None:
        raise MTError("--src needs --ref: the references to tune against")
    for path in (src, ref):
        if not Path(path).is_file():
            raise MTError(f"{path} not found; pass the tuning files with --src and --ref")
    lines, refs = drop_empty(*read_parallel(src, ref), Stats())
    langs = Languages.of(cfg.data)  # (several target languages: the default one's token)
    refs = text_form(cfg.data).references(refs)  # (as translations are written)
    return tagged(lines, langs.tag_of(langs.default)), refs, ()


def refuse_test_split(cfg, src: Path | None, ref: Path | None) -> None:
    """Tuning files that are the run's test split (cfg: best.pt's config) are refused: a test
    score after tuning on the test set estimates nothing."""
    from mt.data.corpus import split_paths
    from mt.errors import MTError

    d = cfg.data
    test = split_paths(d.dir, "test", d.src_lang, d.tgt_lang)
    for given, split in zip((src, ref), test, strict=True):
        if given is not None and Path(given).is_file() and _same(Path(given), Path(split)):
            raise MTError(
                f"{given} is the run's test split: tune on held-out data that is not the "
                f"test set (the run's valid split when --src and --ref are left out), or "
                f"the test score estimates nothing"
            )


def _same(a: Path, b: Path) -> bool:
    return b.is_file() and a.resolve() == b.resolve()


def log_tuning(run_dir: Path, rec: dict, step: int) -> None:
    """mt tune's record appended to the run's train_log.jsonl (at `step`, best.pt's, where the
    end of mt train writes its own), which mt report then shows."""
    import json

    from mt.outputs import write_text

    log = run_dir / "train_log.jsonl"
    if not log.is_file():
        return
    text = log.read_text(encoding="utf-8")
    text += (
        ("" if not text or text.endswith("\n") else "\n")
        + json.dumps({"step": step, "tuned_by": "mt tune", **rec})
        + "\n"
    )
    write_text(log, text)


def tune_best(
    path: Path, src: list[str], refs: list[str], device: str, pairs: tuple = (), **lists
) -> dict:
    """`mt tune`: best.pt read once, tuned over decoding_grid(**lists), its decode config
    rewritten; pairs: the lines of each language pair in src and refs (tuning_pairs), whose
    BLEU train.best_by follows."""
    run = checkpoint.open_trained(path)
    translator = Translator.from_trained(run, device)
    best_by = run.config.train.best_by

    def bleu(hyps: list[str]) -> float:
        return pair_scores(hyps, refs, pairs, best_by)[0]

    rec = tune_decoding(translator, src, decoding_grid(translator, **lists), bleu)
    checkpoint.set_decoding(run.ckpt, rec["tuned_decoding"])
    check_not_training(path)  # (again: a training may have started while this tuned)
    checkpoint.atomic_save(run.ckpt, path)
    return rec


def tune_ensemble(
    run_dir: Path, src: list[str], refs: list[str], device: str, pairs: tuple = (), **lists
) -> dict:
    """`mt tune` of a run of several members (train.members): their ensemble tuned over
    decoding_grid(**lists), the best settings kept in RUN_DIR/ensemble.json (the members'
    own best.pt keep theirs, for use one by one)."""
    from mt.artifacts import members

    translator = Translator.load(run_dir, device)
    first = checkpoint.resolve_all([run_dir])[0]
    best_by = checkpoint.config_of(checkpoint.load(first), str(first)).train.best_by

    def bleu(hyps: list[str]) -> float:
        return pair_scores(hyps, refs, pairs, best_by)[0]

    rec = tune_decoding(translator, src, decoding_grid(translator, **lists), bleu)
    found = members.manifest(run_dir) or {}
    best = rec["tuned_decoding"]
    found["decoding"] = {k: v for k, v in best.items() if k != "valid_bleu"}
    found["tuning"] = {"valid_bleu": best["valid_bleu"], "grid": rec["grid"]}
    members.write_manifest(run_dir, found)
    return rec
