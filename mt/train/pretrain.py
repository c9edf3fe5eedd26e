"""`mt pretrain CONFIG`: masked-language-model pretraining of a translation model's encoder on
the source side of a corpus (BERT, Devlin et al. 2019), and `model.init_encoder: PATH`, which
starts a translation run from the pretrained encoder.

15% of the real source tokens are chosen; of those, 80% are replaced by the mask token, 10% by
a random token and 10% left as they are, and the encoder learns to predict the originals
through the (tied) embedding matrix. The mask token is <unk>: the vocabularies mt trains cover
every character, so <unk> does not occur in text, and the embedding shapes stay those of the
translation model."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mt.artifacts import checkpoint
from mt.config import Config
from mt.data.batching import collate, epoch_batches
from mt.errors import MTError
from mt.tokens import BOS, EOS, PAD, UNK

MASK = UNK
MASK_RATE, REPLACE_MASK, REPLACE_RANDOM = 0.15, 0.8, 0.1


def mask_tokens(src: torch.Tensor, vocab_size: int, generator: torch.Generator | None = None,
                rate: float = MASK_RATE) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) for masked-LM training of src (B, S): targets hold the original ids
    at the chosen positions and PAD elsewhere (not scored); PAD, BOS and EOS are never chosen."""
    def rand(shape):
        return torch.rand(shape, generator=generator, device=src.device)
    real = (src != PAD) & (src != BOS) & (src != EOS)
    chosen = real & (rand(src.shape) < rate)
    roll = rand(src.shape)
    to_mask = chosen & (roll < REPLACE_MASK)
    to_random = chosen & (roll >= REPLACE_MASK) & (roll < REPLACE_MASK + REPLACE_RANDOM)
    randoms = torch.randint(4, vocab_size, src.shape, generator=generator, device=src.device)
    inputs = torch.where(to_mask, torch.full_like(src, MASK), src)
    inputs = torch.where(to_random, randoms, inputs)
    return inputs, src.masked_fill(~chosen, PAD)


def mlm_loss(model, src: torch.Tensor, generator=None) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy over the masked positions, their number)."""
    inputs, targets = mask_tokens(src, model.src_embed.num_embeddings, generator)
    states = model.encode(inputs, inputs == PAD)                       # (B, S, D)
    chosen = targets != PAD
    logits = F.linear(states[chosen], model.src_embed.weight)          # (N, V), tied
    return F.cross_entropy(logits.float(), targets[chosen], reduction="sum"), int(chosen.sum())


# what `mt train` does with these and `mt pretrain` does not: said once, not an error, since
# one config usually serves both commands
TRAIN_ONLY = ("ema_decay", "rdrop_alpha", "scheduled_sampling", "compile", "bpe_dropout",
              "bidirectional_share", "word_dropout")


def pretrain(cfg: Config, run_dir: Path, log=print) -> dict:
    """Train the encoder of cfg.model with the masked-LM loss on data.dir's training sources,
    for train.max_steps updates (or train.max_minutes) on train.device, in train.precision,
    accum_steps batches per update; writes RUN_DIR/pretrained.pt."""
    import os
    from mt.data.prepare import prepare_data
    from mt.runtime.device import amp_dtype, pick_device
    from mt.runtime.distributed import Dist
    from mt.model import build_model
    from mt.train.rundir import prepare_run_dir
    from mt.train.schedule import build_optimizer
    from mt.runtime.threads import choose_threads
    if cfg.model.arch != "transformer":
        raise MTError(f"model.arch {cfg.model.arch}: mt pretrain trains a Transformer encoder")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise MTError("mt pretrain runs as one process: start it with `mt pretrain`, not "
                      "torchrun (the masked-LM encoder trains in minutes on one device)")
    t = cfg.train
    ignored = [f"train.{k}" for k in TRAIN_ONLY
               if getattr(t, k) != type(t).model_fields[k].get_default(call_default_factory=True)]
    if ignored:
        log(f"mt pretrain does not use {', '.join(ignored)} (mt train does)")
    device = pick_device(t.device)
    lock = prepare_run_dir(cfg, run_dir, allow_config_change=True, log=log)
    try:
        choose_threads(t.num_threads, log)
        torch.manual_seed(t.seed)
        tokenizer, data, _ = prepare_data(cfg, run_dir, Dist(), log)
        model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
        model = model.to(device)
        log(f"pretraining the encoder on {device}")
        optimizer, scheduler = build_optimizer(encoder_parameters(model), t, cfg.model.d_model)
        generator = torch.Generator(device=device).manual_seed(t.seed)   # the masks' stream
        record = _loop(model, data, optimizer, scheduler, generator, t, run_dir, log,
                       device, amp_dtype(t.precision, device))
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        ckpt = checkpoint.build(config=cfg.to_dict(), model_state=state,
                                tokenizer=tokenizer, train_state={"step": record["step"]})
        ckpt["pretrained"] = "masked-lm encoder"
        checkpoint.atomic_save(ckpt, run_dir / "pretrained.pt")
        return record
    finally:
        lock.release()


def _batches(data, t, device):
    """The training split's source sides, batch after batch, epoch after epoch."""
    epoch = 0
    while True:
        for indices in epoch_batches(data, t.max_tokens, t.seed, epoch):
            yield collate(data, indices).src.to(device)
        epoch += 1


def _update(model, batches, optimizer, scaler, generator, t, device,
            dtype) -> tuple[float, int]:
    """One optimizer update from t.accum_steps batches, normalised by all their masked
    tokens (so accumulation equals one big batch); (summed loss, masked tokens)."""
    optimizer.zero_grad(set_to_none=True)
    losses, n_total = [], 0
    for src in batches:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss, n = mlm_loss(model, src, generator)
        losses.append(loss)
        n_total += n
    if n_total == 0:
        return 0.0, 0
    total = sum(losses)
    scaler.scale(total / n_total).backward()
    scaler.unscale_(optimizer)
    if t.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(total), n_total


def _loop(model, data, optimizer, scheduler, generator, t, run_dir: Path, log, device,
          dtype) -> dict:
    from mt.train.schedule import budget_progress
    model.train()
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    batches = _batches(data, t, device)
    step, start = 0, time.perf_counter()
    window = [0.0, 0]
    record = {"step": 0}
    while step < t.max_steps:
        loss, n = _update(model, [next(batches) for _ in range(t.accum_steps)], optimizer,
                          scaler, generator, t, device, dtype)
        if n == 0:
            continue
        scheduler.step()
        step += 1
        seconds = time.perf_counter() - start
        if t.cooldown > 0:
            scheduler.set_progress(budget_progress(step, seconds, t.max_steps, t.max_minutes))
        window = [window[0] + loss, window[1] + n]
        out_of_time = t.max_minutes and seconds > 60 * t.max_minutes
        if step % t.log_every == 0 or step == t.max_steps or out_of_time:
            record = {"step": step, "mlm_loss": round(window[0] / window[1], 4),
                      "mlm_ppl": round(math.exp(min(window[0] / window[1], 50)), 2),
                      "masked_tokens": window[1]}
            with open(run_dir / "pretrain_log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            log(f"step {step}: masked-LM loss {record['mlm_loss']} "
                f"(ppl {record['mlm_ppl']})")
            window = [0.0, 0]
        if out_of_time:
            break
    return record


def encoder_parameters(model) -> list:
    """The parameters the masked-LM loss reaches: the encoder's, the (tied) source embedding
    and learned positions; each once."""
    seen, out = set(), []
    for module in (model.encoder, model.enc_norm, model.src_embed, model.positions):
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def encoder_keys(state: dict) -> list[str]:
    """The weights that belong to the encoder side: its layers and final norm, the source
    embedding and the position table (learned positions)."""
    return [k for k in state if k.startswith(("encoder.", "enc_norm.", "src_embed.",
                                              "positions."))]


def pretrained_tokenizer(path: str | None, log=print):
    """The BPE model of the pretrained encoder at `path` (model.init_encoder), which a new run
    starting from it adopts; None without one."""
    if not path:
        return None
    log(f"using the BPE model of {path} (model.init_encoder)")
    return checkpoint.tokenizer_from(checkpoint.load(Path(path)))


def init_encoder(model, path: str, tokenizer, log=print) -> None:
    """Load a pretrained encoder (RUN_DIR/pretrained.pt, or any mt checkpoint) into `model`:
    the same tokenizer and the same shapes, or a one-line error."""
    ckpt = checkpoint.load(Path(path))
    pre_tok = checkpoint.tokenizer_from(ckpt)
    if pre_tok.src_model != tokenizer.src_model:
        raise MTError(f"model.init_encoder {path}: its BPE model differs from this run's; "
                      f"train the run with the pretraining's tokenizer (start it in a new "
                      f"--run-dir: it then adopts the pretrained BPE model)")
    theirs, ours = checkpoint.weights_of(ckpt), model.state_dict()
    keys = encoder_keys(theirs)
    wrong = [k for k in keys if k not in ours or ours[k].shape != theirs[k].shape]
    if wrong or not keys:
        raise MTError(f"model.init_encoder {path}: its encoder does not fit this model "
                      f"({(wrong or ['no encoder weights'])[0]}); use the same model.d_model, "
                      f"n_heads, enc_layers, d_ff and positional as the pretraining")
    model.load_state_dict({k: theirs[k] for k in keys}, strict=False)
    log(f"encoder initialised from {path} ({len(keys)} tensors)")
