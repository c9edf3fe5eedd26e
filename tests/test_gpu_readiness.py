"""What a GPU or several ranks would hit, reached on CPU: gloo ranks, patched device counts and
capabilities, injected faults."""
import os
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import mt.data.prepare
from mt.artifacts import checkpoint
from mt.train.build import build_trainer
from mt.train.objective import install_fast_paths
from mt.config import load_config
from mt.data.batching import collate
from mt.data.download import download
from mt.runtime.device import amp_dtype, decode_dtype
from mt.errors import MTError
from tests.conftest import ROOT, free_port, out_of_memory_on_call

TINY = ROOT / "configs" / "tiny.yaml"


def _cfg(data_dir, *more):
    # train.device cpu: the ranks here are gloo ranks, also on a machine with one GPU
    return load_config(TINY, [f"data.dir={data_dir}", "model.dropout=0.0", "train.device=cpu",
                              *more])


# -- 1. rank 0's solo work outlasting the collective timeout ---------------------------

def _slow_rank0_worker(rank, world, port, data_dir, run_dir, delay):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if rank == 0:                          # downloading/BPE and validating take `delay` s
        real_ensure = mt.data.prepare.ensure_data

        def slow_ensure(*a, **k):
            time.sleep(delay)
            return real_ensure(*a, **k)
        mt.data.prepare.ensure_data = slow_ensure
    t = build_trainer(_cfg(data_dir, "train.dist_timeout_minutes=0.05",   # 3 s
                           "train.max_steps=4", "train.valid_every=2", "train.save_every=100",
                           "train.valid_beam=1"), run_dir, log=lambda *_: None)
    if rank == 0:
        real_validate = t.validate

        def slow_validate():
            time.sleep(delay)
            return real_validate()
        t.validate = slow_validate
    try:
        assert t.fit().step == 4
    finally:
        t.close()


def test_rank0_solo_work_longer_than_the_collective_timeout_is_waited_for(tmp_path):
    mp.spawn(_slow_rank0_worker, args=(2, free_port(), tmp_path / "data", tmp_path / "run", 6),
             nprocs=2, join=True)
    assert (tmp_path / "run" / "last.pt").is_file()


# -- 4 and 11. an out-of-memory batch on one rank ---------------------------------------

def _oom_worker(rank, world, port, data_dir, run_dir, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    t = build_trainer(_cfg(data_dir, "train.dist_timeout_minutes=0.5"), run_dir,
                      log=lambda *_: None)
    assert t.train_model is t.model         # no DDP wrapper (and no buffers re-sent)
    if rank == 1:                                          # rank 1 runs out of memory once
        out_of_memory_on_call(t.model, 2)
    done = [t.train_step([collate(t.train_data, np.arange(rank * 24, rank * 24 + 24))])
            for _ in range(3)]
    torch.save({"done": done, "state": t.state.state_dict(), "model": t.model.state_dict()},
               out / f"rank{rank}.pt")
    t.close()


def test_out_of_memory_on_one_rank_is_skipped_by_all_ranks(tmp_path):
    download("synthetic", tmp_path / "data")
    (tmp_path / "out").mkdir()
    mp.spawn(_oom_worker, args=(2, free_port(), tmp_path / "data", tmp_path / "run",
                                tmp_path / "out"), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / "out" / f"rank{r}.pt") for r in (0, 1))
    assert r0["done"] == r1["done"] == [True, False, True]
    assert r0["state"]["step"] == r1["state"]["step"] == 2
    assert r0["state"]["oom_skipped"] == r1["state"]["oom_skipped"] == 1
    for k, v in r0["model"].items():                     # still one model
        assert torch.equal(v, r1["model"][k]), k


# -- 2. generator states of another number of GPUs --------------------------------------

@pytest.mark.parametrize("saved,here", [(8, 1), (1, 4), (2, 0)])
def test_resume_restores_the_gpu_generators_that_exist_on_both_sides(monkeypatch, saved, here):
    restored, notes = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: here > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: here)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: restored.append(i))
    state = {"torch": torch.get_rng_state(),
             "cuda": [torch.zeros(16, dtype=torch.uint8) for _ in range(saved)]}
    checkpoint.set_rng_state(state, notes.append)
    assert restored == list(range(min(saved, here)))
    assert len(notes) == 1 and f"{saved} GPU(s)" in notes[0] and f"has {here}" in notes[0]


def test_more_ranks_on_a_machine_than_it_has_gpus_is_a_one_line_error(monkeypatch):
    """torchrun --nproc-per-node 2 on a one-GPU machine: every rank says why before it joins
    the group (torch.cuda.set_device would stop only the second, with "invalid device
    ordinal")."""
    from mt.runtime import distributed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda *a, **k: pytest.fail("joined the group"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for rank in ("0", "1"):                  # every rank says it, not only the one left over
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        with pytest.raises(MTError, match=r"started 2 processes on this machine, which has 1 "
                                          r"GPU: use --nproc-per-node 1"):
            distributed.setup("auto")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")      # launched without it: the extra rank still says
    with pytest.raises(MTError, match="started 2 processes"):
        distributed.setup("auto")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)    # enough GPUs: it goes on
    with pytest.raises(pytest.fail.Exception, match="joined the group"):
        distributed.setup("auto")


def test_choosing_a_gpu_turns_cudnn_attention_off(monkeypatch):
    """cuDNN's attention plans each new shape (468 ms against 61 for a first-seen batch
    shape on an H200, docs/gpu.md): choosing a CUDA device leaves SDPA to its other kernels."""
    from mt.runtime.device import pick_device
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert pick_device("cpu").type == "cpu" and torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert pick_device("auto").type == "cuda"
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


# -- 3. the RNN's recurrence under autocast ---------------------------------------------

def test_rnn_recurrence_runs_in_fp32_under_bf16_autocast():
    from mt.config import ModelConfig
    from mt.model import build_model
    seen = []
    for attention in ("bahdanau", "luong", "none"):
        model = build_model(ModelConfig(arch="rnn", attention=attention, d_model=16,
                                        enc_layers=1, dec_layers=1), 30, 30)

        def hook(module, args):
            x = args[0].data if hasattr(args[0], "batch_sizes") else args[0]
            seen.append((torch.is_autocast_enabled("cpu"), x.dtype,
                         None if len(args) < 2 or args[1] is None else args[1].dtype))
        for gru in (model.encoder, model.decoder):
            gru.register_forward_pre_hook(hook)
        src = torch.randint(4, 30, (2, 5))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(src, torch.randint(4, 30, (2, 4)), src == 0)
        assert out.shape[:2] == (2, 4)
    assert seen and all(s == (False, torch.float32, s[2]) and s[2] in (None, torch.float32)
                        for s in seen), seen


# -- 6 and 7. precision choices ---------------------------------------------------------

@pytest.mark.parametrize("capability,expected", [((7, 0), torch.float16), ((7, 5), torch.float16),
                                                 ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_auto_precision_uses_fp16_on_gpus_without_native_bf16(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulation
    assert amp_dtype("auto", torch.device("cuda")) is expected
    assert amp_dtype("auto", torch.device("cpu")) is None


def test_decoding_precision_follows_the_checkpoint_and_the_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert decode_dtype("auto", "fp32", cuda) is None             # trained in fp32: fp32
    assert decode_dtype("auto", "bf16", cuda) is torch.bfloat16
    assert decode_dtype("auto", "fp16", cuda) is torch.float16
    assert decode_dtype("auto", "bf16", cpu) is None              # CPU: fp32
    assert decode_dtype("fp32", "bf16", cuda) is None             # the flag wins
    with pytest.raises(MTError, match="--precision 'half'"):
        decode_dtype("half", "fp32", cpu)


def test_decoding_auto_follows_the_precision_the_run_really_trained_in(tiny_run, monkeypatch):
    """train.precision "auto" is recorded as what it resolved to: a run trained on a CPU
    computed in fp32 and is decoded in fp32 on a GPU too (decoding it in bf16 on an H100
    changed 39 of 1,000 test translations); checkpoints without the record fall back to the
    config, as before."""
    from mt.runtime.device import PRECISION_NAMES
    # tiny_run trained in an `mt` subprocess, and those see no GPU (conftest.cli_env), so on
    # every machine it trained on the CPU
    ran_in = PRECISION_NAMES[amp_dtype("auto", torch.device("cpu"))]
    assert ran_in == "fp32"
    for name in ["best.pt", "last.pt"]:
        ckpt = checkpoint.load(tiny_run / name)
        assert ckpt["config"]["train"]["precision"] == "auto"
        assert checkpoint.trained_precision(ckpt) == ran_in, name
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    cuda = torch.device("cuda")
    assert decode_dtype("auto", "fp32", cuda) is None
    del ckpt["train_state"]["precision"]                 # a checkpoint from before the record
    assert checkpoint.trained_precision(ckpt) == "auto"
    assert decode_dtype("auto", checkpoint.trained_precision(ckpt), cuda) is torch.bfloat16


def test_output_layer_and_log_softmax_are_fp32_under_autocast():
    from mt.config import ModelConfig
    from mt.model import build_model
    from mt.decode.search import _step_lprobs
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64), 50, 50).eval()
    src = torch.randint(4, 50, (3, 6))
    mask = src == 0
    tokens = torch.full((3, 1), 2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory = model.encode(src, mask)
        h = model.decode(tokens, memory, mask)
        lprobs = _step_lprobs(model, tokens, memory, mask, None, 0, tokens)
    assert lprobs.dtype == torch.float32
    with torch.no_grad():
        exact = torch.log_softmax(model.project(h[:, -1].float()), -1)
    ok = torch.isfinite(lprobs)
    torch.testing.assert_close(lprobs[ok], exact[ok], rtol=0, atol=1e-5)


# -- 8. fp16 updates the GradScaler skips -----------------------------------------------

def test_fp16_overflow_skips_are_not_counted_as_steps(tmp_path):
    from mt.data.download import download as dl
    dl("synthetic", tmp_path / "d")
    t = build_trainer(_cfg(tmp_path / "d", "train.precision=fp16", "train.log_every=1",
                           "train.device=auto"),       # the GPU's GradScaler where there is one
                      tmp_path / "run", log=lambda *_: None)
    batches = t._batches()
    assert t.train_step([next(batches)])
    assert t.state.step == 1 and t.scheduler.last_epoch == 1
    weight = t.model.tgt_embed.weight
    handle = weight.register_hook(lambda g: g * float("inf"))       # overflowing gradients
    before = weight.detach().clone()
    assert t.train_step([next(batches)]) is False
    handle.remove()
    assert t.state.step == 1 and t.scheduler.last_epoch == 1       # neither moved
    assert t.state.fp16_skipped == 1
    assert torch.equal(weight.detach(), before)
    assert t.train_step([next(batches)]) and t.state.step == 2
    log = (tmp_path / "run" / "train_log.jsonl").read_text()
    assert '"skipped": "fp16 gradient overflow"' in log
    t.close()


# -- 9. data.max_len against the positions the model has --------------------------------

def test_max_len_beyond_max_positions_is_a_config_error():
    with pytest.raises(MTError, match="data.max_len .300. does not fit model.max_positions .256."):
        load_config(TINY, ["data.max_len=300"])
    with pytest.raises(MTError, match="twice data.max_len"):
        load_config(TINY, ["model.arch=decoder_only", "data.max_len=200"])
    assert load_config(TINY, ["model.arch=decoder_only", "data.max_len=128"]).max_side_len == 128
    assert load_config(TINY, ["model.arch=rnn", "data.max_len=300"])     # no position table


# -- 10. tokens search must never emit ---------------------------------------------------

def test_search_never_emits_pad_bos_or_unk():
    from mt.config import ModelConfig
    from mt.model import build_model
    from mt.decode.search import beam_search, greedy
    from mt.tokens import BOS, EOS, PAD, UNK
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64), 40, 40).eval()
    real = model.project

    def project(h):   # a model that loves the special tokens
        logits = real(h)
        logits[..., [PAD, BOS, UNK]] += 100.0
        return logits
    model.project = project
    src = torch.randint(4, 40, (3, 5))
    outs = greedy(model, src, src == 0, 0.0, 4) + beam_search(model, src, src == 0, 3, 1.0, 0.0, 4)
    emitted = {tok for out in outs for tok in out}
    assert emitted and not {PAD, BOS, UNK} & emitted, outs
    assert EOS not in emitted


# -- mt/fast is CPU speed work: "auto" leaves it out on a GPU ----------------------------
def test_fast_paths_auto_installs_them_on_a_cpu_only():
    """train.fast_paths "auto" (the default) swaps in mt/fast and its fused loss on a CPU and
    trains the reference model and loss elsewhere (on an H200 mt/fast made training slower:
    docs/gpu.md); true and false force either on any device. A model on the meta device
    stands in for a GPU's: the choice reads the device the model is on."""
    from mt.config import ModelConfig, TrainConfig
    from mt.fast import FAST
    from mt.model import build_model
    assert TrainConfig().fast_paths == "auto"

    def installed(setting, device):
        model = build_model(ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64),
                            50, 50).to(device)
        fused = install_fast_paths(model, TrainConfig(fast_paths=setting))
        swapped = any(type(m) in FAST.values() for m in model.modules())
        assert swapped == fused
        return swapped

    assert installed("auto", "cpu") and not installed("auto", "meta")
    assert installed(True, "meta") and not installed(False, "cpu")
    with pytest.raises(MTError, match="train.fast_paths"):
        load_config(TINY, ["train.fast_paths=sometimes"])
    # 1 == True, so a Literal of booleans alone would take 1 and 0 where every other
    # boolean key refuses them.
    for number in ("1", "0"):
        with pytest.raises(MTError, match="train.fast_paths: expected 'auto', true or false"):
            load_config(TINY, [f"train.fast_paths={number}"])
