"""The data path at WMT's size: a synthetic corpus of N pairs with WMT14 en-de's sentence
lengths goes through mt's real pipeline into the memory-mapped token cache once; then how fast a
run starts from the cache, how fast batches come (epoch order and collation on one CPU core,
target tokens/s), and what R ranks of one machine hold: proportional set size (PSS: a page
shared by R processes counts 1/R to each), against each rank holding its own copy of the ids.

    python scripts/bench/bench_token_cache.py --pairs 4500000 [--ranks 2 --ranks 8] [--json]

Lengths: words per sentence drawn from a log-normal fitted to WMT14 en-de's training side
(median about 22 words, a long tail), clipped to 1-120.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import WORDS


def write_corpus(n: int, folder: Path) -> None:
    rng = random.Random(0)
    with open(folder / "train.xx", "w") as fs, open(folder / "train.yy", "w") as ft:
        for _ in range(n):
            k = min(120, max(1, round(rng.lognormvariate(math.log(22), 0.6))))
            words = rng.choices(WORDS, k=k)
            fs.write(" ".join(words) + "\n")
            ft.write(" ".join(w.upper() for w in reversed(words)) + "\n")


def build(folder: Path) -> dict:
    """BPE on a sample, then the cache written: what the first `mt train` on a corpus does."""
    from mt.data import token_cache
    from mt.data.corpus import Stats, clean_pairs, encode_stream, iter_parallel
    from mt.data.selection import sample_pairs
    from mt.data.tokenizer import Tokenizer

    paths = [folder / "train.xx", folder / "train.yy"]
    t0 = time.perf_counter()
    src, tgt = sample_pairs(clean_pairs(iter_parallel(*paths), Stats()), 200_000, seed=0)
    tok = Tokenizer.train(
        src, tgt, vocab_size=8000, joint=True, character_coverage=1.0, max_sentences=400_000, seed=0
    )
    del src, tgt
    stats = Stats()
    data = encode_stream(clean_pairs(iter_parallel(*paths), stats), tok, max_len=256, stats=stats)
    key = token_cache.cache_key(paths, [tok.src_model], 256)
    folder_ = token_cache.folder_for(key)
    token_cache.save(folder_, data)
    return {"key": key, "pairs": stats.kept, "build_s": round(time.perf_counter() - t0, 1)}


def batches_per_second(key: str, max_tokens: int) -> dict:
    """An epoch's batches from the mapped cache, collated on one core."""
    import torch

    from mt.data import token_cache
    from mt.data.batching import collate, epoch_batches

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data = token_cache.load(token_cache.folder_for(key))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batches = epoch_batches(data, max_tokens, seed=1, epoch=0)
    order_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = 0
    for b in batches:
        tokens += int((collate(data, b).tgt_out != 0).sum())
    collate_s = time.perf_counter() - t0
    return {
        "load_s": round(load_s, 3),
        "epoch_order_s": round(order_s, 2),
        "batches": len(batches),
        "target_tokens": tokens,
        "collate_tgt_tok_per_s": round(tokens / collate_s),
        "epoch_tgt_tok_per_s": round(tokens / (collate_s + order_s)),
    }


RANK = """
import sys, numpy as np
from mt.data import token_cache
data = token_cache.load(token_cache.folder_for(sys.argv[1]))
arrays = [data.src.data, data.src.lengths, data.src.offsets, data.tgt.data, data.tgt.lengths,
          data.tgt.offsets]
if sys.argv[2] == "copy":  # what each rank holds without the cache: its own ids, unmapped
    arrays = [np.array(a) for a in arrays]
    del data
    import gc
    gc.collect()
total = sum(int(a.sum(dtype=np.int64)) for a in arrays)  # every page read
lines = open("/proc/self/smaps_rollup").read().splitlines()[1:]
rollup = dict(line.split(":", 1) for line in lines)
print(int(rollup["Pss"].split()[0]), int(rollup["Rss"].split()[0]), flush=True)
sys.stdin.read()  # held until every rank has measured
"""


def ranks_memory(key: str, ranks: int, mode: str) -> dict:
    """PSS and RSS (MB) of `ranks` processes holding the ids at once."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, key, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(ranks)
    ]
    got = [tuple(map(int, p.stdout.readline().split())) for p in procs]
    for p in procs:
        p.stdin.close()
        p.wait()
    return {
        "pss_mb_total": round(sum(pss for pss, _ in got) / 1024),
        "rss_mb_total": round(sum(rss for _, rss in got) / 1024),
        "pss_mb_per_rank": round(sum(pss for pss, _ in got) / 1024 / ranks),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4_500_000)
    ap.add_argument("--ranks", type=int, action="append", help="rank counts (default 2 and 8)")
    ap.add_argument("--max-tokens", type=int, default=32768)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ranks = args.ranks or [2, 8]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ.setdefault("MT_CACHE_DIR", str(folder / "cache"))
        t0 = time.perf_counter()
        write_corpus(args.pairs, folder)
        result: dict = {"write_corpus_s": round(time.perf_counter() - t0, 1)}
        result.update(build(folder))
        result.update(batches_per_second(result["key"], args.max_tokens))
        for r in ranks:
            result[f"ranks_{r}_cache"] = ranks_memory(result["key"], r, "map")
            result[f"ranks_{r}_copies"] = ranks_memory(result["key"], r, "copy")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
