"""Masked-LM encoder pretraining: the masking rates, init_encoder loading exactly the
encoder's weights, and `mt pretrain` running through the Trainer (accumulation, resume)."""

import json

import torch

from mt.artifacts import checkpoint
from mt.config import ModelConfig
from mt.model import build_model
from mt.objectives.mlm import mask_tokens
from mt.tokens import BOS, EOS, MASK, PAD
from mt.train.pretrained import encoder_keys, init_encoder
from tests.conftest import EXACT_ADAM, ROOT, assert_user_error, join_ranks, run_mt, tiny_config


def test_masking_rates_are_berts_and_spare_special_positions():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 500, (400, 60), generator=g)
    src[:, -1] = EOS
    src[::3, 40:] = PAD
    src[:, 0] = BOS
    inputs, targets = mask_tokens(src, 500, g)
    real = src >= 4
    chosen = targets != PAD
    assert not (chosen & ~real).any()  # never PAD, BOS, EOS
    assert torch.equal(targets[chosen], src[chosen])  # the originals
    assert torch.equal(inputs[~chosen], src[~chosen])  # the rest untouched
    rate = chosen.sum() / real.sum()
    masked = (inputs[chosen] == MASK).float().mean()
    kept = (inputs[chosen] == src[chosen]).float().mean()
    assert abs(float(rate) - 0.15) < 0.01
    assert abs(float(masked) - 0.8) < 0.02
    assert abs(float(kept) - 0.1) < 0.02  # (a random draw may also hit the original)


def test_init_encoder_loads_exactly_the_encoder(tmp_path):
    cfg = ModelConfig(
        d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64, tie_embeddings="decoder"
    )
    torch.manual_seed(1)
    pretrained = build_model(cfg, 50, 50)
    run = tmp_path / "pre"
    run.mkdir()
    from mt.data.tokenizer import Tokenizer

    lines = [f"w{i} w{i % 7} x{i % 3}" for i in range(200)]
    tok = Tokenizer.train(
        lines, lines, vocab_size=50, joint=True, character_coverage=1.0, max_sentences=1000, seed=0
    )
    ckpt = checkpoint.build(
        config={}, model_state=pretrained.state_dict(), tokenizer=tok, train_state={}
    )
    checkpoint.atomic_save(ckpt, run / "pretrained.pt")
    torch.manual_seed(2)
    fresh = build_model(cfg, 50, 50)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    init_encoder(fresh, str(run / "pretrained.pt"), tok, log=lambda *_: None)
    after, theirs = fresh.state_dict(), pretrained.state_dict()
    enc = set(encoder_keys(after))
    assert enc and any(k.startswith("encoder.") for k in enc) and "src_embed.weight" in enc
    for k, v in after.items():
        expected = theirs[k] if k in enc else before[k]
        assert torch.equal(v, expected), k
    assert any(not torch.equal(after[k], theirs[k]) for k in after if k.startswith("decoder."))


def test_pretrain_then_translate_from_the_pretrained_encoder(tmp_path):
    data = tmp_path / "d"
    proc = run_mt(
        "pretrain",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "mlm",
        "--set",
        f"data.dir={data}",
        "train.max_steps=20",
        "train.log_every=10",
    )
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "mlm" / "train_log.jsonl").read_text().splitlines()
    assert len(log) == 2 and all('"loss"' in x for x in log)
    pre = str(tmp_path / "mlm" / "pretrained.pt")
    # a pretrained encoder is not a translation model: every command that needs one says so
    from tests.conftest import mt_here

    for args in (
        ["translate", tmp_path / "mlm"],
        ["translate", pre, "-o", tmp_path / "out.txt"],
        ["export", tmp_path / "mlm", tmp_path / "ct2"],
    ):
        code, _, err = mt_here(*args, input="a b\n")
        assert code == 2 and "pretrained by mt pretrain" in err, (args, err)
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "ct2").exists()
    proc = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "mt",
        "--set",
        f"data.dir={data}",
        "train.max_steps=4",
        f"model.init_encoder={pre}",
    )
    assert proc.returncode == 0, proc.stderr
    assert "encoder initialised from" in proc.stderr
    assert (tmp_path / "mt" / "spm.model").read_bytes() == (
        tmp_path / "mlm" / "spm.model"
    ).read_bytes()  # the pretraining's BPE
    assert_user_error(
        run_mt(
            "train",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            tmp_path / "bad",
            "--set",
            f"data.dir={data}",
            "model.d_model=32",
            f"model.init_encoder={pre}",
        ),
        "does not fit this model",
    )


def _pretrain_log(tmp_path, name, *sets):
    proc = run_mt(
        "pretrain",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / name,
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "train.log_every=1",
        *sets,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    lines = (tmp_path / name / "train_log.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if '"loss"' in x], proc.stderr


def test_accumulated_batches_make_one_update_with_all_their_masked_tokens(tmp_path):
    # each batch's mask is drawn from its position alone, whatever the model does, so one
    # update of two batches masks exactly the tokens of two updates of one batch each
    one, _ = _pretrain_log(tmp_path, "one", "train.max_steps=2")
    two, _ = _pretrain_log(tmp_path, "two", "train.max_steps=1", "train.accum_steps=2")
    assert [r["step"] for r in one] == [1, 2] and [r["step"] for r in two] == [1]
    assert two[0]["tokens"] == one[0]["tokens"] + one[1]["tokens"] > 0


def test_pretrain_says_which_train_options_it_does_not_use(tmp_path):
    records, stderr = _pretrain_log(
        tmp_path, "ema", "train.max_steps=1", "train.ema_decay=0.9", "train.precision=bf16"
    )
    assert "mt pretrain does not use train.ema_decay (mt train does)" in stderr
    assert records[-1]["step"] == 1 and records[-1]["loss"] > 0  # bf16 autocast on CPU
    _, plain = _pretrain_log(tmp_path, "plain", "train.max_steps=1")
    assert "does not use" not in plain


def test_pretrain_resumes_exactly_and_is_not_resumed_by_mt_train(tmp_path):
    # one run of 6 updates against 3, stopped by its budget, then resumed to 6 in the same
    # run directory: the encoder's weights are bit for bit the same (RNG, data position and
    # each batch's mask all come back)
    def run(name, steps):
        proc = run_mt(
            "pretrain",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            tmp_path / name,
            "--set",
            f"data.dir={tmp_path / 'd'}",
            f"train.max_steps={steps}",
            "model.dropout=0.3",
            "train.log_every=1",
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    run("whole", 6)
    run("parts", 3)
    assert "resuming from" in run("parts", 6)
    whole, parts = (checkpoint.load(tmp_path / n / "pretrained.pt") for n in ("whole", "parts"))
    assert parts["train_state"]["step"] == 6
    for k, v in checkpoint.weights_of(whole).items():
        assert torch.equal(v, checkpoint.weights_of(parts)[k]), k
    logs = [(tmp_path / n / "train_log.jsonl").read_text() for n in ("whole", "parts")]
    assert [json.loads(x)["loss"] for x in logs[0].splitlines()] == [
        json.loads(x)["loss"] for x in logs[1].splitlines()
    ]
    assert_user_error(
        run_mt(
            "train",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            tmp_path / "whole",
            "--set",
            f"data.dir={tmp_path / 'd'}",
            "train.max_steps=6",
            "model.dropout=0.3",
            "train.log_every=1",
        ),
        "written by `mt pretrain`",
    )


def _pretrain_cfg(data_dir, *more):
    return tiny_config(data_dir, *EXACT_ADAM, "train.max_steps=3", "train.log_every=1", *more)


def _pretrain_rank(rank, world, port, data_dir, run_dir):
    from mt.train.build import build_trainer

    join_ranks(rank, world, port)
    t = build_trainer(_pretrain_cfg(data_dir), run_dir, log=lambda *_: None, pretraining=True)
    try:
        t.fit()
    finally:
        t.close()


def test_two_ranks_pretrain_as_one_rank_accumulating_their_batches(tmp_path):
    # rank r takes every other batch and the masks follow the batch's position, so two ranks
    # of one batch each make the updates of one rank accumulating two batches
    import shutil

    import torch.multiprocessing as mp

    from mt.data.download import download
    from mt.train.build import build_trainer
    from tests.conftest import free_port

    data = tmp_path / "d"
    download("synthetic", data)
    single = build_trainer(
        _pretrain_cfg(data, "train.accum_steps=2"),
        tmp_path / "one",
        log=lambda *_: None,
        pretraining=True,
    )
    try:
        single.fit()
    finally:
        single.close()
    (tmp_path / "two").mkdir()
    shutil.copy(tmp_path / "one/spm.model", tmp_path / "two/spm.model")  # same BPE
    mp.spawn(_pretrain_rank, args=(2, free_port(), data, tmp_path / "two"), nprocs=2, join=True)
    one, two = (checkpoint.load(tmp_path / n / "last.pt") for n in ("one", "two"))
    assert one["train_state"]["step"] == two["train_state"]["step"] == 3
    logs = [
        [json.loads(x) for x in (tmp_path / n / "train_log.jsonl").read_text().splitlines()]
        for n in ("one", "two")
    ]
    assert [r["tokens"] for r in logs[0]] == [r["tokens"] for r in logs[1]]
    for k, v in one["model"].items():
        torch.testing.assert_close(two["model"][k], v, atol=1e-6, rtol=1e-5, msg=k)
