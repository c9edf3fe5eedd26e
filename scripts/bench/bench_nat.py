"""Non-autoregressive (Mask-Predict) against autoregressive decoding: quality and speed.

Quality: the NAT run decodes the test split with T iterations for each --iterations, the
autoregressive run with greedy and beam search; each is scored with sacreBLEU (cased BLEU and
chrF) and the Multi30k papers' lowercased tokenized BLEU. Speed: every decoder translates the
same sentences one at a time (batch 1, the latency a user of an interactive service sees) and in
batches of --batch sentences, the decoders taking turns item by item (scripts/bench/harness.py)
so that a drift in the machine's speed hits all alike; it prints sentences/s and each one's
speed-up over the autoregressive beam search.

    python scripts/bench/bench_nat.py --nat runs/story/nat --ar runs/story/transformer-plain \
        --data-dir data/multi30k [--sentences 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from harness import take_turns

from mt.data.corpus import read_lines
from mt.data.textform import moses_languages
from mt.decode.translator import Translator
from mt.evaluate.metrics import lc_tok_bleu, score


def with_iterations(nat: Translator, iterations: int) -> Translator:
    """The same NAT model decoding with another number of mask-predict iterations."""
    return Translator(
        nat.model,
        nat.tokenizer,
        nat.cfg.model_copy(update={"nat_iterations": iterations}),
        nat.device,
        nat.amp_dtype,
    )


def decoders(nat: Translator, ar: Translator, iterations: list[int], beam: int) -> dict:
    """name -> callable(list of lines) -> translations."""
    out = {
        "AR greedy": lambda lines: ar.translate(lines, beam=1),
        f"AR beam {beam}": lambda lines: ar.translate(lines, beam=beam),
    }
    for t in iterations:
        out[f"NAT T={t}"] = with_iterations(nat, t).translate
    return out


def quality(runners: dict, src: list[str], ref: list[str], lang: str) -> dict:
    rows = {}
    for name, run in runners.items():
        hyps = run(src)
        s = score(hyps, ref)
        rows[name] = {"bleu": round(s.bleu, 2), "chrf": round(s.chrf, 2)}
        if lang in moses_languages():  # the Multi30k papers' BLEU
            rows[name]["bleu_lc_tok"] = round(lc_tok_bleu(hyps, ref, lang), 2)
        print(
            f"{name:12s} " + "  ".join(f"{k} {v:6.2f}" for k, v in rows[name].items()), flush=True
        )
    return rows


def speed(runners: dict, src: list[str], batch: int) -> dict:
    """Sentences/s of each runner over `src` cut into items of `batch` sentences (the first
    item is a warm-up, not timed)."""
    items = [src[i : i + batch] for i in range(0, len(src), batch)]
    secs = take_turns(runners, items[:1] + items, 1, torch.device("cpu"))
    return {name: len(src) / s for name, s in secs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nat", required=True, help="a model.arch nat run directory or checkpoint")
    p.add_argument("--ar", required=True, help="an autoregressive run of the same data")
    p.add_argument("--data-dir", default="data/multi30k")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--iterations", default="1,4,10")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=200, help="timed sentences")
    p.add_argument("--batch", type=int, default=100, help="sentences per batched call")
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args()
    data = Path(a.data_dir)
    src = read_lines(data / f"test.{a.src_lang}")
    ref = read_lines(data / f"test.{a.tgt_lang}")
    nat, ar = Translator.load(a.nat, device="cpu"), Translator.load(a.ar, device="cpu")
    runners = decoders(nat, ar, [int(t) for t in a.iterations.split(",")], a.beam)
    print(f"quality on {len(src)} test sentences ({torch.get_num_threads()} threads):")
    result = {"threads": torch.get_num_threads(), "quality": quality(runners, src, ref, a.tgt_lang)}
    for label, batch in (("batch 1", 1), (f"batches of {a.batch}", a.batch)):
        rates = speed(runners, src[: a.sentences], batch)
        base = rates[f"AR beam {a.beam}"]
        print(f"speed, {label}, {a.sentences} sentences taking turns:")
        for name, r in rates.items():
            print(f"  {name:12s} {r:8.1f} sentences/s  {r / base:5.2f}x AR beam {a.beam}")
        result[label] = {name: round(r, 2) for name, r in rates.items()}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
