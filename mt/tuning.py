"""Choose the decoding settings (beam size, length penalty) on the validation split, never on
a test set, and store them in best.pt so that `mt translate RUN_DIR` uses them."""
from __future__ import annotations

from pathlib import Path

from mt import checkpoint
from mt.metrics import score
from mt.translator import Translator


def tune_decoding(run_dir: Path, src: list[str], refs: list[str], beams: list[int],
                  penalties: list[float], device: str) -> dict:
    """Translate the validation source with every (beam, length penalty) of the grid using
    best.pt, keep the highest BLEU (ties: the smaller beam, then the penalty nearer 1) and
    write it into best.pt's decode config. Returns the record for train_log.jsonl."""
    path = run_dir / "best.pt"
    translator = Translator.from_checkpoint(path, device)
    grid = []
    for beam in beams:
        # beam 1 is greedy search, where the length penalty plays no part
        for lp in (penalties if beam > 1 else [translator.cfg.length_penalty]):
            s = score(translator.translate(src, beam=beam, length_penalty=lp), refs)
            grid.append({"beam": beam, "length_penalty": lp, "valid_bleu": round(s.bleu, 2)})
    best = max(grid, key=lambda g: (g["valid_bleu"], -g["beam"], -abs(g["length_penalty"] - 1)))
    ckpt = checkpoint.load(path)
    ckpt["config"]["decode"].update(beam=best["beam"], length_penalty=best["length_penalty"])
    checkpoint.atomic_save(ckpt, path)
    return {"tuned_decoding": best, "grid": grid}
