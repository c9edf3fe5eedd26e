"""train.ema_decay: the exponential moving average of the weights (mt/train/ema.py)."""

import torch

from mt.train.ema import WeightAverage


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5, bias=True)
        self.out.weight = self.embed.weight  # tied, as mt ties embeddings
        self.register_buffer("table", torch.arange(4.0))


def test_average_follows_the_recurrence_with_its_warm_up():
    torch.manual_seed(0)
    model = _Tied()
    ema = WeightAverage(model, decay=0.9)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update()
        d = min(0.9, (1 + n) / (10 + n))  # 0.2, 0.27, ... then 0.9
        expected = [
            d * e + (1 - d) * p.detach() for e, p in zip(expected, model.parameters(), strict=True)
        ]
    for a, e in zip(ema.average, expected, strict=True):
        assert torch.allclose(a, e, atol=1e-6)


def test_weights_put_the_average_under_every_name_of_a_tied_parameter():
    model = _Tied()
    ema = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    ema.update()
    w = ema.weights(model)
    assert set(w) == set(model.state_dict())
    assert torch.equal(w["embed.weight"], w["out.weight"])
    assert not torch.equal(w["embed.weight"], model.embed.weight)  # the average, not raw
    assert torch.equal(w["table"], model.table)  # buffers as they are
    fresh = _Tied()
    fresh.load_state_dict(w)  # loads as a model
    assert torch.equal(fresh.out.weight, w["out.weight"])


def test_state_round_trip_resumes_the_same_average():
    model = _Tied()
    ema = WeightAverage(model, decay=0.99)
    for _ in range(3):
        with torch.no_grad():
            model.out.bias.add_(1.0)
        ema.update()
    again = WeightAverage(model, decay=0.99)
    again.load_state_dict(ema.state_dict(model), model)
    assert again.updates == 3
    assert all(torch.equal(a, b) for a, b in zip(again.average, ema.average, strict=True))


def test_a_run_validates_and_snapshots_the_average_and_resumes_from_raw_weights(tmp_path):
    from mt.artifacts import checkpoint
    from mt.config import load_config
    from mt.train.build import build_trainer
    from tests.conftest import ROOT

    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [
            f"data.dir={tmp_path / 'd'}",
            "train.max_steps=6",
            "train.save_every=6",
            "train.valid_every=6",
            "train.ema_decay=0.9",
            "decode.tune_beams=[]",
            "train.valid_beam=1",
        ],
    )
    t = build_trainer(cfg, tmp_path / "run", log=lambda *_: None)
    t.fit()
    # on the CPU, where checkpoint.load puts what it reads (the run trains on a GPU if any)
    average = {k: v.cpu() for k, v in t.ema.weights(t.model).items()}
    raw = {k: v.cpu() for k, v in t.model.state_dict().items()}
    assert not all(torch.equal(average[k], raw[k]) for k in raw)
    snap = checkpoint.load(tmp_path / "run/step_6.pt")["model"]
    assert all(torch.equal(snap[k], average[k]) for k in average)
    last = checkpoint.load(tmp_path / "run/last.pt")
    assert all(torch.equal(last["model"][k], raw[k]) for k in raw)
    assert last["ema"]["updates"] == 6
    best = checkpoint.load(tmp_path / "run/best.pt")["model"]
    assert all(torch.equal(best[k], average[k]) for k in average)
