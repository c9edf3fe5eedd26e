"""Choose the decoding settings (beam size, length penalty) on the validation split, never on
a test set, and store them in best.pt so that `mt translate RUN_DIR` uses them."""

from __future__ import annotations

from pathlib import Path

from mt.artifacts import checkpoint
from mt.decode.translator import Translator
from mt.evaluate.metrics import score


def tune_decoding(
    translator: Translator,
    src: list[str],
    refs: list[str],
    beams: list[int],
    penalties: list[float],
) -> dict:
    """Translate the validation source with every (beam, length penalty) of the grid and keep
    the highest BLEU (ties: the smaller beam, then the penalty nearer 1). Returns the record
    for train_log.jsonl: {"tuned_decoding": best, "grid": [...]}."""
    grid = []
    for beam in beams:
        # beam 1 is greedy search, where the length penalty plays no part
        for lp in penalties if beam > 1 else [translator.cfg.length_penalty]:
            s = score(translator.translate(src, beam=beam, length_penalty=lp), refs)
            grid.append({"beam": beam, "length_penalty": lp, "valid_bleu": round(s.bleu, 2)})
    best = max(grid, key=lambda g: (g["valid_bleu"], -g["beam"], -abs(g["length_penalty"] - 1)))
    return {"tuned_decoding": best, "grid": grid}


def tuning_pairs(best: Path, src: Path | None, ref: Path | None) -> tuple[list, list]:
    """The tuning sentences: `src` and `ref`, or the run's valid split (from best.pt's
    config); pairs with an empty side dropped."""
    from mt.data.corpus import Stats, drop_empty, read_parallel, split_paths
    from mt.errors import MTError

    if src is None:
        d = checkpoint.config_of(checkpoint.load(best), str(best)).data
        src, ref = split_paths(d.dir, "valid", d.src_lang, d.tgt_lang)
    if ref is None:
        raise MTError("--src needs --ref: the references to tune against")
    for path in (src, ref):
        if not Path(path).is_file():
            raise MTError(f"{path} not found; pass the tuning files with --src and --ref")
    return drop_empty(*read_parallel(src, ref), Stats())


def tune_best(
    path: Path,
    src: list[str],
    refs: list[str],
    beams: list[int],
    penalties: list[float],
    device: str,
) -> dict:
    """`mt tune`: best.pt read once, tuned, its decode config rewritten."""
    run = checkpoint.open_trained(path)
    rec = tune_decoding(Translator.from_trained(run, device), src, refs, beams, penalties)
    best = rec["tuned_decoding"]
    checkpoint.set_decoding(run.ckpt, best["beam"], best["length_penalty"])
    checkpoint.atomic_save(run.ckpt, path)
    return rec
