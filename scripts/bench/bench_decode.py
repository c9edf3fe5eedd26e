"""Beam-5 decoding speed: mt's batched beam search with its key/value cache against (a) the
same model and search without the cache, (b) the same search at a GPU's pace
(the host looking every 8 steps, what `mt translate` uses on a GPU) and (c) Hugging Face
`generate` on a MarianMTModel of the same size (and CTranslate2 with --ctranslate2, on the
CPU: CTranslate2 4.8's GPU build needs CUDA 12's cuBLAS, which a CUDA 13 machine lacks). All
decode exactly --steps output tokens per sentence (EOS is suppressed until then), so every
contender does the same work.

    python scripts/bench/bench_decode.py --data-dir data/multi30k [--sentences 1000] [--json]
    python scripts/bench/bench_decode.py --data-dir data/multi30k --device cuda --precision bf16

On a GPU both contenders run on it, under the same autocast (--precision), and the timers wait
for the GPU (harness.sync) so that queued kernels are counted. Target tokens/s = sentences x
--steps / seconds (the unit of CTranslate2's published table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from harness import autocast, marian_config, sync, take_turns

from mt.data.batching import pad_sources
from mt.data.corpus import read_lines
from mt.data.tokenizer import Tokenizer
from mt.decode.options import DecodeOptions
from mt.decode.search import EVERY_STEP, ON_DEVICE, search
from mt.decode.step import CompiledStep
from mt.model import LayerShape, Transformer
from mt.tokens import EOS, PAD

# the model decoded: the 256-d model the measurements of docs/performance.md used, and the
# Transformer base of Vaswani et al. (2017)
SIZES = {
    "small": {"d_model": 256, "n_heads": 4, "layers": 3, "d_ff": 1024},
    "base": {"d_model": 512, "n_heads": 8, "layers": 6, "d_ff": 2048},
}


def batches_of(ids: list[np.ndarray], size: int):
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # as mt translate does
    for i in range(0, len(order), size):
        yield pad_sources([ids[j] for j in order[i : i + size]])


def timed(decode, ids, args) -> float:
    """Seconds for `decode` over all batches, after one untimed warm-up batch (first-call
    allocations and kernel selection would otherwise count against whoever runs first)."""
    decode(next(batches_of(ids, args.batch_size)))
    sync(args.device)
    t0 = time.perf_counter()
    for src in batches_of(ids, args.batch_size):
        decode(src)
    sync(args.device)
    return time.perf_counter() - t0


def taking_turns(decoders: dict, ids, args) -> dict:
    """Seconds per contender over all batches, the contenders taking turns batch by batch
    (which one goes first rotates) after one untimed warm-up batch each: a drift in the
    machine's speed, which on this VM reaches tens of percent within a minute, then hits all
    alike and the ratio holds."""
    batches = list(batches_of(ids, args.batch_size))
    return take_turns(decoders, batches[:1] + batches, 1, args.device)


def ours_decoder(model, args, use_cache: bool, pace=EVERY_STEP, compiled=None):
    """mt's search (beam --beam; 1: greedy) at `pace`, over a static cache through `compiled`
    where given."""
    opts = DecodeOptions(
        beam=args.beam,
        max_len_a=0,
        max_len_b=args.steps,
        min_len=args.steps - 1,
        use_cache=use_cache,
    )

    @torch.no_grad()
    def decode(src):
        src = src.to(args.device)
        with autocast(args.device, args.precision):
            out = search(model, src, src == PAD, opts, pace=pace, compiled=compiled)
        assert all(len(found[0][0]) == args.steps - 1 for found in out)

    return decode


def ct2_decoder(model, tok, args, folder):
    """The same model exported with mt.artifacts.export, decoded by CTranslate2 with the same
    beam and the same number of output tokens, on as many threads as torch uses."""
    import ctranslate2

    from mt.artifacts.export import model_spec
    from mt.config import Config, ModelConfig

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            z = SIZES[args.size]
            cfg = Config(
                model=ModelConfig(
                    d_model=z["d_model"],
                    n_heads=z["n_heads"],
                    enc_layers=z["layers"],
                    dec_layers=z["layers"],
                    d_ff=z["d_ff"],
                    norm="post",
                    max_positions=256,
                )
            )
            return model_spec(model, cfg, tok)

    Converter().convert(str(folder), force=True)
    ct2 = ctranslate2.Translator(
        str(folder), device="cpu", inter_threads=1, intra_threads=torch.get_num_threads()
    )

    def decode(src):
        batch = [[tok.src.IdToPiece(int(i)) for i in row if i not in (PAD, EOS)] for row in src]
        out = ct2.translate_batch(
            batch,
            beam_size=args.beam,
            max_decoding_length=args.steps,
            min_decoding_length=args.steps,
            length_penalty=1.0,
        )
        assert all(len(r.hypotheses[0]) == args.steps for r in out)

    return decode


def hf_decoder(vocab, args):
    from transformers import MarianMTModel

    z = SIZES[args.size]
    cfg = marian_config(
        vocab, z["d_model"], z["layers"], z["n_heads"], z["d_ff"], forced_eos_token_id=None
    )
    model = MarianMTModel(cfg).eval().to(args.device)

    @torch.no_grad()
    def decode(src):
        src = src.to(args.device)
        with autocast(args.device, args.precision):
            out = model.generate(
                input_ids=src,
                attention_mask=src != PAD,
                num_beams=args.beam,
                min_new_tokens=args.steps,
                max_new_tokens=args.steps,
                do_sample=False,
                early_stopping=False,
            )
        assert out.shape[1] == args.steps + 1  # + decoder start token

    return decode


def setup(args):
    """The BPE model (from the corpus), the test sentences as ids and an untrained model of the
    Multi30k size (its weights do not change the work: every output has --steps tokens)."""
    d = args.data_dir
    tok = Tokenizer.train(
        read_lines(d / f"train.{args.src}")[:10000],
        read_lines(d / f"train.{args.tgt}")[:10000],
        vocab_size=8000,
        joint=True,
        character_coverage=1.0,
        max_sentences=20000,
        seed=0,
    )
    lines = read_lines(d / f"test.{args.src}")[: args.sentences]
    ids = [np.asarray(x, dtype=np.int64) for x in tok.encode_src(lines)]
    torch.manual_seed(0)
    z = SIZES[args.size]
    model = (
        Transformer(
            src_vocab=tok.src_vocab_size,
            tgt_vocab=tok.tgt_vocab_size,
            shape=LayerShape(
                d_model=z["d_model"], n_heads=z["n_heads"], d_ff=z["d_ff"], dropout=0.1
            ),
            enc_layers=z["layers"],
            dec_layers=z["layers"],
            tie_embeddings="all",
            max_positions=256,
        )
        .eval()
        .to(args.device)
    )
    return tok, ids, model


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, required=True, help="folder with test.SRC and train.*")
    ap.add_argument("--src", default="de")
    ap.add_argument("--tgt", default="en")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--size", choices=sorted(SIZES), default="small", help="the model's shape")
    ap.add_argument("--steps", type=int, default=30, help="output tokens per sentence")
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed passes per cached contender (median)"
    )
    ap.add_argument("--skip-nocache", action="store_true")
    ap.add_argument(
        "--ctranslate2",
        action="store_true",
        help="also CTranslate2 on the same model (pip install 'mt[export]')",
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="autocast for both contenders (bf16 is meant for a GPU)",
    )
    ap.add_argument(
        "--compile-step",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also the search at a GPU's pace with its static cache and compiled decoder step "
        "(CUDA graphs on a GPU; default: on a GPU only)",
    )
    ap.add_argument(
        "--compile-backend", default=None, help="torch.compile backend for it (default: inductor)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from mt.runtime.device import pick_device

    args.device = pick_device(args.device, "--device")  # cuDNN attention off, as mt translate
    if args.compile_step is None:
        args.compile_step = args.device.type == "cuda"
    if args.ctranslate2 and args.device.type != "cpu":
        ap.error("--ctranslate2 is measured on the CPU only")
    tok, ids, model = setup(args)
    where = (
        torch.cuda.get_device_name(0)
        if args.device.type == "cuda"
        else f"{torch.get_num_threads()} threads"
    )
    print(
        f"{len(ids)} sentences, beam {args.beam}, batches of {args.batch_size}, {args.steps} "
        f"output tokens each, the {args.size} model, {where}, {args.precision}"
    )
    result = measure(args, tok, ids, model)
    if "ratio_nocache" in result:
        print(f"speed-up over no cache: {result['ratio_nocache']:.2f}x")
    print(
        f"at a GPU's pace: {result['ratio_device_turns']:.2f}x the speed at a CPU's pace, "
        f"{result['ratio_hf_device_turns']:.2f}x HF generate's (taking turns)"
    )
    if "ratio_graph_turns" in result:
        print(
            f"with the compiled step: {result['ratio_graph_turns']:.2f}x the speed at a CPU's "
            f"pace, {result['ratio_hf_graph_turns']:.2f}x HF generate's (taking turns)"
        )
    print(
        f"speed-up over HF generate: {result['ratio_hf']:.2f}x ({result['ratio_hf_turns']:.2f}x "
        f"taking turns)"
        + (
            f"; CTranslate2 took {result['ratio_ct2_turns']:.2f}x mt's time taking turns"
            if "ratio_ct2_turns" in result
            else ""
        )
    )
    if args.json:
        print(json.dumps(result))


def measure(args, tok, ids, model) -> dict:
    n = len(ids)
    ours_dec, hf_dec = (
        ours_decoder(model, args, use_cache=True),
        hf_decoder(tok.tgt_vocab_size, args),
    )
    runs = {"ours": [], "hf": []}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
        runs["ours"].append(timed(ours_dec, ids, args))
        runs["hf"].append(timed(hf_dec, ids, args))
    ours, hf = statistics.median(runs["ours"]), statistics.median(runs["hf"])
    tok_s = n * args.steps
    print(
        f"mt (KV cache)      {ours:7.2f} s  {n / ours:7.1f} sent/s  {tok_s / ours:9.0f} tgt tok/s"
        f"   (median of {args.repeats})"
    )
    print(f"HF Marian generate {hf:7.2f} s  {n / hf:7.1f} sent/s  {tok_s / hf:9.0f} tgt tok/s")
    contenders = {
        "ours": ours_dec,
        "ours_device": ours_decoder(model, args, use_cache=True, pace=ON_DEVICE),
        "hf": hf_dec,
    }
    if args.compile_step:  # the static cache and the compiled step (CUDA graphs on a GPU)
        compiled = CompiledStep(args.device, backend=args.compile_backend)
        contenders["ours_graph"] = ours_decoder(model, args, True, ON_DEVICE, compiled)
    if args.ctranslate2:
        import tempfile

        contenders["ct2"] = ct2_decoder(model, tok, args, Path(tempfile.mkdtemp()) / "ct2")
    turns = taking_turns(contenders, ids, args)
    print("taking turns batch by batch: " + ", ".join(f"{k} {v:.2f} s" for k, v in turns.items()))
    result = {
        "sentences": n,
        "ours_s": round(ours, 2),
        "ours_sent_s": round(n / ours, 2),
        "ours_tgt_tok_s": round(tok_s / ours),
        "hf_tgt_tok_s": round(tok_s / hf),
        "hf_s": round(hf, 2),
        "ratio_hf": round(hf / ours, 2),
        "ours_s_turns": round(turns["ours"], 2),
        "hf_s_turns": round(turns["hf"], 2),
        "ratio_hf_turns": round(turns["hf"] / turns["ours"], 2),
        "ours_device_s_turns": round(turns["ours_device"], 2),
        "ours_device_tgt_tok_s": round(tok_s / turns["ours_device"]),
        "ratio_device_turns": round(turns["ours"] / turns["ours_device"], 2),
        "ratio_hf_device_turns": round(turns["hf"] / turns["ours_device"], 2),
    }
    if "ours_graph" in turns:
        result.update(
            ours_graph_s_turns=round(turns["ours_graph"], 2),
            ours_graph_tgt_tok_s=round(tok_s / turns["ours_graph"]),
            ratio_graph_turns=round(turns["ours"] / turns["ours_graph"], 2),
            ratio_hf_graph_turns=round(turns["hf"] / turns["ours_graph"], 2),
        )
    if "ct2" in turns:
        result.update(
            ct2_s_turns=round(turns["ct2"], 2),
            ratio_ct2_turns=round(turns["ct2"] / turns["ours"], 2),
            ratio_ct2_device_turns=round(turns["ct2"] / turns["ours_device"], 2),
        )
    if not args.skip_nocache:
        nocache = timed(ours_decoder(model, args, use_cache=False), ids, args)
        print(f"mt without cache   {nocache:7.1f} s  {n / nocache:7.1f} sent/s")
        result.update(nocache_s=round(nocache, 2), ratio_nocache=round(nocache / ours, 2))
    return result


if __name__ == "__main__":
    main()
