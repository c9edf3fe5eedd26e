"""One line per run of its train_log.jsonl: greedy valid BLEU by validation, the average of
the last snapshots, and the tuned beam's valid BLEU (what docs/multi30k_recipe.md's tables
hold).   python scripts/lab/recipe_summary.py RUN_DIR [RUN_DIR ...]"""

import json
import sys
from pathlib import Path


def summary(run: Path) -> str:
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines() if x]
    curve = [
        f"{r['step']}: {r['valid_bleu']}"
        for r in records
        if "valid_bleu" in r and "averaged" not in r
    ]
    parts = [f"{run.name}: greedy valid BLEU " + ", ".join(curve)]
    for r in records:
        if "averaged" in r:
            parts.append(
                f"average of the last {r['averaged']}: {r['valid_bleu']}"
                + (" (kept)" if r.get("best") else " (not kept)")
            )
        if "tuned_decoding" in r:
            t = r["tuned_decoding"]
            parts.append(
                f"tuned: beam {t['beam']}, length penalty {t['length_penalty']}, {t['valid_bleu']}"
            )
    return "; ".join(parts)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(summary(Path(arg)))
