"""The two kinds of update (mt/train/step.py): the plain one, as a textbook writes it, and the
device one, with flat buffers and skips settled on the device, give the same weights, skips,
log rows and checkpoints from the same batches, and a run resumes from one into the other."""

from __future__ import annotations

import json

import pytest
import torch

from mt.artifacts import checkpoint
from mt.config import load_config
from mt.errors import MTError
from mt.runtime.distributed import Dist
from mt.train.build import build_trainer
from mt.train.step import update_kind
from tests.conftest import EXACT_ADAM, ROOT

# Adam nearly linear in the gradient (EXACT_ADAM), so that a wrong scale of the gradients
# shows in the weights
COMMON = ("train.log_every=4", "train.valid_every=100", "train.save_every=6", *EXACT_ADAM)


def _trainer(path, kind: str, *more: str):
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={path.parent / 'd'}", "train.device=cpu", f"train.update={kind}",
         *COMMON, *more],
    )  # fmt: skip
    return build_trainer(cfg, path, log=lambda *_: None)


def _poison(trainer, bad_call: int) -> None:
    """The model's output NaN on its `bad_call`-th forward call."""
    real, calls = trainer.model.decode, [0]

    def decode(*a, **k):
        calls[0] += 1
        out = real(*a, **k)
        return out * float("nan") if calls[0] == bad_call else out

    trainer.model.decode = decode


def _log(run) -> list[dict]:
    return [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]


# clipping that binds (the tiny task's gradient norms are above 0.05), which an update that
# skipped it would not pass; none, where a gradient of the wrong scale would be clipped back
@pytest.mark.parametrize("clip", ["0.05", "0"])
def test_both_kinds_train_the_same_weights_skips_logs_and_checkpoints(tmp_path, clip):
    """12 updates of two batches each, of each kind, from the same weights and batches; the
    8th batch's loss NaN (skipped by both: by the host's read in the plain update, on the
    device and taken back at the check step of update 4 in the device one)."""
    more = ("train.max_steps=12", f"train.clip_norm={clip}", "train.accum_steps=2")
    runs = {kind: _trainer(tmp_path / kind, kind, *more) for kind in ("plain", "device")}
    plain, device = runs["plain"], runs["device"]
    assert type(plain.update).__name__ == "PlainUpdate"
    assert type(device.update).__name__ == "DeviceUpdate"
    for name, v in plain.model.state_dict().items():  # (the same seed: the same start)
        assert torch.equal(v, device.model.state_dict()[name]), name
    for t in runs.values():
        _poison(t, 8)
        t.fit()
    for name, v in plain.model.state_dict().items():
        torch.testing.assert_close(v, device.model.state_dict()[name], rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")  # fmt: skip

    logs = {kind: _log(tmp_path / kind) for kind in runs}
    rows = {k: [(r["step"], r["lr"], r["loss"], r["tokens"]) for r in log if "loss" in r]
            for k, log in logs.items()}  # fmt: skip
    assert [r[:2] for r in rows["plain"]] == [r[:2] for r in rows["device"]]
    assert [r[0] for r in rows["plain"]] == [4, 8, 12]
    for a, b in zip(rows["plain"], rows["device"], strict=True):
        assert a[3] == b[3] and abs(a[2] - b[2]) <= 1e-4 * abs(b[2]), (a, b)
    skips = {k: [(r["skipped"], r["count"]) for r in log if "skipped" in r]
             for k, log in logs.items()}  # fmt: skip
    assert skips["plain"] == skips["device"] == [("non-finite loss", 1)]

    saved = {k: checkpoint.load(tmp_path / k / "last.pt") for k in runs}
    a, b = saved["plain"], saved["device"]
    ignore = ("run_id", "train_seconds")
    assert {k: v for k, v in a["train_state"].items() if k not in ignore} == {
        k: v for k, v in b["train_state"].items() if k not in ignore
    }
    assert a["train_state"]["step"] == 12
    assert a["scheduler"] == b["scheduler"]
    for i, st in a["optimizer"]["state"].items():  # Adam's step counts skip the same update
        other = b["optimizer"]["state"][i]
        assert float(st["step"]) == float(other["step"]) == 12
        torch.testing.assert_close(st["exp_avg"], other["exp_avg"], rtol=1e-4, atol=1e-7)


def test_a_run_resumes_from_one_kind_into_the_other(tmp_path):
    """6 plain updates, then resumed to 12 as device updates: the same steps, learning rates
    and losses as 12 plain updates in one go."""
    every = "train.log_every=2"  # (a log row where the first part stops)
    _trainer(tmp_path / "whole", "plain", "train.max_steps=12", every).fit()
    _trainer(tmp_path / "split", "plain", "train.max_steps=6", every).fit()
    resumed = _trainer(tmp_path / "split", "device", "train.max_steps=12", every)
    assert resumed.state.step == 6 and type(resumed.update).__name__ == "DeviceUpdate"
    resumed.fit()
    whole, split = (
        [(r["step"], r["lr"], r["loss"]) for r in _log(tmp_path / run) if "loss" in r]
        for run in ("whole", "split")
    )
    assert [r[:2] for r in whole] == [r[:2] for r in split]
    for (_, _, x), (_, _, y) in zip(whole, split, strict=True):
        assert abs(x - y) <= 1e-4 * abs(x), (x, y)


def test_auto_takes_the_device_update_on_a_gpu_or_with_ranks():
    cpu, gpu, one, two = torch.device("cpu"), torch.device("cuda"), Dist(), Dist(rank=0, world=2)
    assert update_kind("auto", cpu, one) == "plain"
    assert update_kind("auto", gpu, one) == "device"
    assert update_kind("auto", cpu, two) == "device"
    assert update_kind("device", cpu, one) == "device"
    assert update_kind("plain", gpu, one) == "plain"
    with pytest.raises(MTError, match=r"train\.update: plain trains one process"):
        update_kind("plain", cpu, two)
