"""Data preparation at scale: a synthetic corpus of N pairs through mt's real pipeline
(read + clean, BPE training on a sample, encoding to int32 arrays, length-bucketed batches).
Prints seconds and peak RSS; run it for several N to see how time and memory grow.

    python scripts/bench/bench_data.py --pairs 250000 --pairs 1000000 [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A 3,000-word lexicon of letter strings, so a word is about one BPE token, as in real text.
_rng = random.Random(1)
WORDS = sorted(
    {
        "".join(_rng.choice("abcdefghijklmnoprstuvwz") for _ in range(_rng.randint(2, 9)))
        for _ in range(3200)
    }
)[:3000]


def write_corpus(n: int, folder: Path) -> None:
    rng = random.Random(0)
    with open(folder / "train.xx", "w") as fs, open(folder / "train.yy", "w") as ft:
        for _ in range(n):
            k = rng.randint(5, 30)
            words = rng.choices(WORDS, k=k)
            fs.write(" ".join(words) + "\n")
            ft.write(" ".join(w.upper() for w in reversed(words)) + "\n")


def prepare(folder: Path) -> dict:
    from mt.data.batching import epoch_batches, padding_fraction
    from mt.data.corpus import Stats, clean_pairs, encode_stream, iter_parallel
    from mt.data.selection import sample_pairs
    from mt.data.tokenizer import Tokenizer

    t0 = time.perf_counter()
    stats = Stats()
    paths = folder / "train.xx", folder / "train.yy"
    # what `mt train` does: BPE on a streamed sample, then the split streamed into token ids
    src, tgt = sample_pairs(clean_pairs(iter_parallel(*paths), Stats()), 200_000, seed=0)
    tok = Tokenizer.train(
        src, tgt, vocab_size=8000, joint=True, character_coverage=1.0, max_sentences=400_000, seed=0
    )
    del src, tgt
    data = encode_stream(clean_pairs(iter_parallel(*paths), stats), tok, max_len=256, stats=stats)
    batches = epoch_batches(data, 8192, seed=1, epoch=0)
    return {
        "pairs": stats.kept,
        "seconds": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "batches": len(batches),
        "tokens": int(data.src.data.size + data.tgt.data.size),
        "padding": round(padding_fraction(data.tgt, batches), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--pairs", type=int, action="append", help="N (repeatable); default 250k and 1M"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(prepare(args.worker)))
        return
    results = []
    for n in args.pairs or [250_000, 1_000_000]:
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(n, Path(tmp))
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", tmp], capture_output=True, text=True
            )  # own process: its own peak RSS
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(
            f"{r['pairs']:>9} pairs: {r['seconds']:7.1f} s, peak RSS {r['peak_rss_mb']} MB, "
            f"{r['tokens'] / 1e6:.1f}M tokens, {r['batches']} batches, "
            f"target padding {r['padding']:.1%}"
        )
    if len(results) > 1:
        a, b = results[0], results[-1]
        ratio, scale = b["seconds"] / a["seconds"], b["pairs"] / a["pairs"]
        print(f"time ratio {ratio:.2f} for {scale:.1f}x the pairs")
    if args.json:
        print(json.dumps(results[-1] | {"runs": results}))


if __name__ == "__main__":
    main()
