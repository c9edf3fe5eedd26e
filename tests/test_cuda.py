"""On a CUDA GPU, the code paths a CPU never takes: the fast model and the fused loss on CUDA
tensors, bf16 autocast, fp16 with the GradScaler, and decoding on the GPU against the CPU.
Skipped where no GPU is visible (CI); run on a GPU machine by scripts/gpu_check.sh."""

import functools
import json

import pytest
import torch

from mt import fast
from mt.objectives.loss import label_smoothed_nll, reference_loss
from mt.tokens import PAD
from tests.conftest import ROOT, run_mt, run_tiny, window_losses
from tests.test_fast_paths import _padded_batch, _small_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")
# a test whose logic a CPU can run too takes the device as a parameter: the CPU runs its body
# in the default suite, so that it cannot rot unseen, and a GPU machine runs the same body
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """fp32 comparisons mean fp32: TF32 matmuls (10-bit mantissa) would need bf16 tolerances."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def _loss_and_grads(model, batch, loss_fn, device, amp=None):
    model.to(device).train()
    with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
        loss, nll = loss_fn(model, batch.to(device), 0.1)
    (loss * 0.01).backward()
    return (
        loss.detach().float(),
        nll.detach().float(),
        {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None},
    )


@pytest.mark.parametrize(
    "arch,norm",
    [("transformer", "post"), ("transformer", "pre"), ("decoder_only", "post"), ("rnn", "post")],
)
@needs_cuda
def test_fast_model_on_cuda_equals_the_reference_on_cpu(arch, norm):
    """The model as training runs it on a GPU (fast modules installed, chunked loss, CUDA
    kernels) gives the CPU reference model's loss and every gradient, in fp32."""
    from mt.fast import chunked_loss

    batch = _padded_batch()
    ref = _loss_and_grads(_small_model(arch, norm), batch, reference_loss, torch.device("cpu"))
    got = _loss_and_grads(_small_model(arch, norm, parts=fast.PARTS), batch, chunked_loss, CUDA)
    assert _rel(got[0], ref[0]) < 1e-5 and _rel(got[1], ref[1]) < 1e-5
    assert got[2].keys() == ref[2].keys()
    for name, g in ref[2].items():
        assert _rel(got[2][name], g) < 1e-4, name


@needs_cuda
@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
def test_autocast_training_step_tracks_fp32(amp):
    """Under bf16 / fp16 autocast the loss and gradients stay fp32's within half precision, and
    the loss comes back in fp32 (log-softmax and the loss are computed in fp32)."""
    from mt.fast import chunked_loss

    batch = _padded_batch()
    ref = _loss_and_grads(_small_model(parts=fast.PARTS), batch, chunked_loss, CUDA)
    model = _small_model(parts=fast.PARTS)
    model.to(CUDA).train()
    with torch.autocast("cuda", dtype=amp):
        loss, _ = chunked_loss(model, batch.to(CUDA), 0.1)
    assert loss.dtype == torch.float32
    got = _loss_and_grads(_small_model(parts=fast.PARTS), batch, chunked_loss, CUDA, amp=amp)
    assert _rel(got[0], ref[0]) < 1e-2
    for name, g in ref[2].items():
        # whole-tensor relative error; 0.06 (bf16) and 0.07 (fp16, unscaled small gradients)
        # seen with CPU autocast
        assert _rel(got[2][name], g) < 0.15, name
        assert got[2][name].dtype == torch.float32, name  # fp32 master weights


@needs_cuda
@pytest.mark.parametrize("spread", [1.0, 40.0])
def test_fused_loss_on_cuda_matches_fp64(spread):
    """The fused projection + loss on CUDA (where every chunk takes the logsumexp branch)
    against the fp64 CPU reference, also when target probabilities underflow in fp32."""
    from mt.fast.loss import linear_smoothed_cross_entropy

    g = torch.Generator().manual_seed(5)
    h = torch.randn(700, 32, generator=g, dtype=torch.float64)
    w = torch.randn(300, 32, generator=g, dtype=torch.float64) * spread / 6
    y = torch.randint(1, 300, (700,), generator=g)
    ha, wa = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref_loss, ref_nll, _ = label_smoothed_nll(torch.log_softmax(ha @ wa.t(), -1), y, 0.1, PAD)
    ref_loss.backward()
    hb = h.float().to(CUDA).requires_grad_()
    wb = w.float().to(CUDA).requires_grad_()
    loss, nll = linear_smoothed_cross_entropy(hb, wb, y.to(CUDA), 0.1, chunk=256)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(hb.grad).all()
    assert _rel(loss.detach(), ref_loss.detach()) < 1e-5
    assert _rel(nll, ref_nll.detach()) < 1e-5
    assert _rel(hb.grad, ha.grad) < 1e-4 and _rel(wb.grad, wa.grad) < 1e-4


def _train(tmp_path, precision):
    run = tmp_path / precision
    every = ["train.valid_every=200", "train.save_every=100", "train.log_every=20"]
    # eager: the compiled step has tests of its own, and a compile per `mt train` process
    # would take most of the part's budget
    device = ["train.device=cuda", f"train.precision={precision}", "train.compile=false"]
    run_tiny(run, tmp_path / "data", "train.max_steps=200", *every, *device, gpu=True)
    return run


@needs_cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mt_train_on_cuda_learns_and_saves_fp32_weights(tmp_path, precision):
    """`mt train` on the GPU in bf16 and fp16: the training loss falls, every logged loss is
    finite, the checkpoint holds fp32 weights on the CPU side of torch.load, and fp16 keeps its
    GradScaler state (so a resumed run scales as the interrupted one did)."""
    run = _train(tmp_path, precision)
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r and "valid_bleu" not in r]
    assert losses and all(x == x and x < 1e4 for x in losses), losses  # no NaN, no overflow
    assert losses[-1] < 0.7 * losses[0], losses
    ckpt = torch.load(run / "last.pt", map_location="cpu", weights_only=False)
    assert all(t.dtype == torch.float32 for t in ckpt["model"].values() if t.is_floating_point())
    assert ckpt["config"]["train"]["precision"] == precision
    if precision == "fp16":
        assert ckpt["scaler"].get("scale", 0) > 0, ckpt["scaler"]


@needs_cuda
def test_decoding_on_cuda_equals_decoding_on_cpu(tmp_path):
    """One checkpoint, decoded on the GPU in fp32 and on the CPU: the same translations (beam
    search with length penalty, batched with padding), apart from rare near-ties."""
    run = _train(tmp_path, "bf16")
    src = tmp_path / "data" / "valid.src"
    outs = {}
    for device in ["cuda", "cpu"]:
        hyp = tmp_path / f"hyp.{device}"
        proc = run_mt(
            "translate",
            run,
            "-i",
            src,
            "-o",
            hyp,
            "--device",
            device,
            "--precision",
            "fp32",
            gpu=True,
        )
        assert proc.returncode == 0, proc.stderr
        outs[device] = hyp.read_text().splitlines()
    assert len(outs["cuda"]) == len(outs["cpu"]) > 50
    same = sum(a == b for a, b in zip(outs["cuda"], outs["cpu"], strict=True))
    assert same >= 0.95 * len(outs["cpu"]), same


@pytest.mark.parametrize(
    "overrides", ["model.arch=decoder_only", "model.arch=rnn", "model.positional=relative"]
)
@needs_cuda
def test_each_architecture_trains_resumes_translates_and_shows_attention_on_cuda(
    tmp_path, overrides
):
    """The CLI tests run on the CPU (tests/conftest.py: cli_env); here the other architectures
    go through `mt train` (bf16), a resume, `mt translate` and `mt attention` on the GPU."""
    run, common = (
        tmp_path / "run",
        [
            "--set",
            f"data.dir={tmp_path / 'data'}",
            "train.valid_every=12",
            "train.save_every=6",
            "train.log_every=6",
            "train.compile=false",  # (as _train: the compiled step has tests of its own)
            *overrides.split(),
        ],
    )
    for steps in (12, 14):
        proc = run_mt(
            "train",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            run,
            *common,
            f"train.max_steps={steps}",
            gpu=True,
        )
        assert proc.returncode == 0, proc.stderr
    assert "resuming from" in proc.stdout + proc.stderr
    proc = run_mt("translate", run, "--beam", "2", input="a b c\n\nd e f g h\n", gpu=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")[:-1]
    assert len(out) == 3 and out[1] == "" and "on cuda" in proc.stderr, proc.stderr
    picture = run_mt("attention", run, "a b c", "-o", tmp_path / "attn.png", gpu=True)
    assert picture.returncode == 0 and (tmp_path / "attn.png").stat().st_size > 0, picture.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_the_search_on_the_device_equals_the_batch_shrinking_search(device):
    """The search at the GPU's pace (ON_DEVICE: a look every 8 steps, finished sentences
    frozen until then) returns the hypotheses of the CPU's pace (EVERY_STEP), fp32 scores
    within 1e-4 (greedy's are None at both), reading the device once per look."""
    import math

    from mt.decode.search import ON_DEVICE, max_lengths
    from mt.runtime.host_syncs import HostSyncs
    from tests.conftest import beam_nbest, make_model, make_src

    model = make_model().to(device).eval()
    src = make_src([7, 4, 9, 5, 12, 3, 8, 6]).to(device)
    mask = src == PAD
    steps = int(max_lengths(mask, 1.5, 10, model.max_positions - 1).max())
    for beam, nbest in ((1, 1), (5, 1), (5, 5), (10, 3)):
        args = (model, src, mask, beam, nbest, 1.0, 1.5, 10)
        with HostSyncs() as syncs:
            got = beam_nbest(*args, pace=ON_DEVICE)
        want = beam_nbest(*args)
        assert [[i for i, _ in s] for s in got] == [[i for i, _ in s] for s in want]
        for sg, sw in zip(got, want, strict=True):
            for (_, a), (_, b) in zip(sg, sw, strict=True):
                assert (a is None) is (b is None) is (beam == 1)
                assert b is None or abs(a - b) <= 1e-4 * max(1.0, abs(b))
        assert syncs.count <= 1 + math.ceil(steps / ON_DEVICE.check_every) + 4, syncs.where


@needs_cuda
@pytest.mark.parametrize("accum", [1, 2])
def test_compiled_training_through_cuda_graphs_takes_the_eager_steps(tmp_path, accum):
    """train.compile on packed blocks (one static shape) on the GPU: the step is recorded as
    CUDA graphs and replayed (reduce-overhead), with `accum` batches per update, and gives the
    eager step's losses and weights (fp32, dropout off) over enough updates to replay."""
    import torch._dynamo

    from mt.config import load_config
    from mt.train.build import build_trainer

    def trainer(name, *more):
        cfg = load_config(
            ROOT / "configs/tiny.yaml",
            [
                f"data.dir={tmp_path / 'd'}",
                "train.device=cuda",
                "train.precision=fp32",  # (auto is bf16 on a GPU)
                "model.dropout=0.0",
                "train.pack_width=64",
                "train.max_tokens=1024",
                f"train.accum_steps={accum}",
                *more,
            ],
        )
        return build_trainer(cfg, tmp_path / name, log=lambda *_: None)

    from mt.fast.flex import FlexMultiHeadAttention, flex_layout

    torch._dynamo.reset()
    eager = trainer("e", "train.compile=false")
    graphed = trainer("g", "train.compile=true", "model.attn_dropout=0")
    graphed.model.load_state_dict(eager.model.state_dict())
    assert graphed.cuda_graphs and not eager.cuda_graphs
    # the compiled step's attention takes block masks, the eager reference dense ones
    assert graphed.objective.loss.keywords["layout"] is flex_layout
    assert eager.objective.loss.keywords["layout"] is None
    assert type(graphed.model.encoder[0].self_attn) is FlexMultiHeadAttention
    walks = eager.batches(), graphed.batches()
    for _ in range(6):
        assert eager.train_step([next(walks[0]) for _ in range(accum)])
        assert graphed.train_step([next(walks[1]) for _ in range(accum)])
    torch.testing.assert_close(window_losses(graphed), window_losses(eager), rtol=1e-4, atol=0)
    assert_same_weights(graphed.model, eager.model)
    torch._dynamo.reset()


def assert_same_weights(model, reference) -> None:
    """Every weight of configs/tiny.yaml's `model` close to `reference`'s (trained from the
    same start), but the attention key biases: softmax ignores a constant added to a query's
    every score, so their gradient is zero in exact arithmetic, and Adam turns its rounding
    noise into steps of +-lr that differ between any two ways of computing."""
    keys = key_bias_segments(reference)
    want, compared = reference.state_dict(), []
    for name, got in model.state_dict().items():
        ref = want[name]
        if name in keys:
            rest = torch.ones(len(ref), dtype=torch.bool, device=ref.device)
            rest[keys[name]] = False
            got, ref = got[rest], ref[rest]
            grad = dict(reference.named_parameters())[name].grad
            assert grad[keys[name]].abs().max() <= 1e-4 * grad[rest].abs().max(), name
        torch.testing.assert_close(got, ref, atol=1e-3, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
        compared.append(name)
    assert len(keys) == 2 * 2 + 2 and sorted(compared) == sorted(want)  # (tiny: 2 + 2 layers)


@needs_cuda
def test_the_whole_update_as_one_cuda_graph_takes_the_eager_updates(tmp_path):
    """train.update graph on the GPU (mt/train/update/graphed.py): after its warm-up the compiled
    step, the gradients' copy, settle and Adam are one CUDA graph replayed per update, and
    give the eager device update's losses and weights (fp32, dropout off); with dropout on,
    each replay of the same batch draws new masks (another loss), with the learning rate
    the device reads (0: the weights stay)."""
    import torch._dynamo

    from mt.config import load_config
    from mt.train.build import build_trainer
    from mt.train.update.graphed import WARMUP

    def trainer(name, *more):
        sets = [f"data.dir={tmp_path / 'd'}", "train.device=cuda", "train.precision=fp32"]
        sets += ["train.pack_width=64", "train.max_tokens=1024", "model.attn_dropout=0"]
        cfg = load_config(ROOT / "configs/tiny.yaml", [*sets, *more])
        return build_trainer(cfg, tmp_path / name, log=lambda *_: None)

    torch._dynamo.reset()
    eager = trainer("e", "train.compile=false", "train.update=device", "model.dropout=0.0")
    graphed = trainer("g", "train.compile=true", "train.update=graph", "model.dropout=0.0")
    graphed.model.load_state_dict(eager.model.state_dict())
    walks = eager.batches(), graphed.batches()
    for _ in range(WARMUP + 5):
        assert eager.train_step([next(walks[0])]) and graphed.train_step([next(walks[1])])
    assert graphed.update.graph is not None
    torch.testing.assert_close(window_losses(graphed), window_losses(eager), rtol=1e-4, atol=0)
    assert_same_weights(graphed.model, eager.model)

    torch._dynamo.reset()
    dropout = trainer("d", "train.compile=true", "train.update=graph", "model.dropout=0.3")
    walk = dropout.batches()
    for _ in range(WARMUP + 1):
        assert dropout.train_step([next(walk)])
    batch = next(walk)
    dropout.optimizer.param_groups[0]["lr"] = 0.0
    before = [p.detach().clone() for p in dropout.model.parameters()]
    rows = [dropout.update([batch], dropout.state)[0].item() for _ in range(3)]
    assert len(set(rows)) == 3, rows
    assert all(torch.equal(a, p) for a, p in zip(before, dropout.model.parameters(), strict=True))
    torch._dynamo.reset()


def key_bias_segments(model) -> dict[str, slice]:
    """The attention key biases in `model`'s state_dict: the middle third of a fused
    self-attention qkv.bias, the first half of a cross-attention kv.bias."""
    out = {}
    for name, p in model.state_dict().items():
        if name.endswith(".qkv.bias"):
            out[name] = slice(len(p) // 3, 2 * len(p) // 3)
        elif name.endswith(".kv.bias"):
            out[name] = slice(0, len(p) // 2)
    return out


@needs_cuda
def test_a_ranked_update_on_cuda_makes_no_host_sync(tmp_path):
    """An update of the flat exchange as a rank runs it, with the time budget on (its
    all-reduce through NCCL, in a group of one here), under CUDA's sync debug mode "error":
    any host sync in the update or in what follows it outside a check step raises."""
    import torch.distributed as tdist
    from tqdm import tqdm

    from mt.config import load_config
    from mt.runtime.distributed import Dist
    from mt.train.build import build_trainer
    from mt.train.update.exchange import Flat

    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.device=cuda", "train.max_minutes=10",
         "train.log_every=100", "train.compile=false"],  # (the eager update: every objective's)
    )  # fmt: skip
    t = build_trainer(cfg, tmp_path / "run", log=lambda *_: None)
    tdist.init_process_group("nccl", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        ranked = Dist(rank=0, world=2)  # (a rank's exchange; its group has one rank here)
        t.dist = t.budget.dist = t.update.dist = ranked
        t.update.exchange = Flat(t.optimizer.param_groups[0]["params"], ranked, t.device, 4096)
        t.budget.start(t.state)
        batches, bar = t.batches(), tqdm(disable=True)
        for update in range(3):  # (the first allocates Adam's state)
            batch = [next(batches)]
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error" if update else "default")
            try:
                assert t.train_step(batch)
                assert not t._after_update(bar)  # steps 2 and 3: no check step
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert t.state.step == 3
    finally:
        tdist.destroy_process_group()
        t.close()


@needs_cuda
def test_dropout_under_the_graphed_step_draws_new_masks_on_every_replay(tmp_path):
    """The compiled step on packed blocks replays CUDA graphs: in train mode each replay
    draws its own dropout masks (the same batch gives another loss every time, as eager
    dropout does), and in eval mode the replayed step gives the eager loss."""
    import torch._dynamo

    from mt.config import load_config
    from mt.train.build import build_trainer

    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.device=cuda", "model.dropout=0.3",
         "train.pack_width=64", "train.max_tokens=1024", "train.compile=true"],
    )  # fmt: skip
    torch._dynamo.reset()
    t = build_trainer(cfg, tmp_path / "g", log=lambda *_: None)
    assert t.cuda_graphs
    batch = next(t.batches())
    t.model.train()
    seen = [float(t._loss(batch, loss=t.compiled_loss)[0]) for _ in range(5)]
    assert len(set(seen[2:])) == 3, seen  # (the first calls record the graphs)
    t.model.eval()
    with torch.no_grad():
        replayed = [float(t._loss(batch, loss=t.compiled_loss)[0]) for _ in range(3)]
        eager = float(t._loss(batch)[0])
    assert replayed[-1] == pytest.approx(eager, rel=1e-4)
    t.close()
    torch._dynamo.reset()


@needs_cuda
def test_flex_attention_gives_the_dense_masks_gradients_on_packed_blocks():
    """mt/fast/flex.py on the GPU, compiled: a packed batch's loss and every gradient equal the
    reference's with the dense masks (fp32)."""
    import numpy as np

    from mt.config import ModelConfig
    from mt.data.batching import collate_packed
    from mt.data.packing import pack_blocks
    from mt.fast import flex
    from mt.model import Parts, build_model
    from tests.test_packing import _corpus

    data = _corpus(60, seed=3)
    block = pack_blocks(data.src.lengths, data.tgt.lengths, 32, 8, seed=1)[0]
    batch = collate_packed(data, block, 32, 8).to(CUDA)
    cfg = ModelConfig(d_model=64, n_heads=4, enc_layers=2, dec_layers=2, d_ff=128, dropout=0.0,
                      attn_dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    reference = build_model(cfg, 40, 40).to(CUDA).train()
    parts = Parts(attention=flex.FlexMultiHeadAttention)
    flexed = build_model(cfg, 40, 40, parts).to(CUDA).train()
    flexed.load_state_dict(reference.state_dict())
    torch._dynamo.reset()
    flexing = functools.partial(reference_loss, eps=0.1, layout=flex.flex_layout)
    step = torch.compile(flexing, dynamic=False)
    got = step(flexed, batch)
    want = reference_loss(reference, batch, eps=0.1)
    (got[0] / batch.n_tokens).backward()
    (want[0] / batch.n_tokens).backward()
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=0)
    for (k, p), q in zip(flexed.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-6, msg=k)
    assert np.isfinite(got[0].item())
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_the_attention_key_biases_get_no_gradient(device):
    """Why the compiled training test leaves the key biases out: a key bias adds q . b_k to
    every score of a query, which softmax ignores; its gradient is rounding noise alone."""
    from tests.conftest import make_model, make_src

    model = make_model().to(device).train()
    src = make_src([7, 4, 9, 5]).to(device)
    tgt = make_src([6, 8, 3, 5], seed=2).to(device)
    logits = model(src, tgt, src == PAD)
    logits.float().log_softmax(-1)[tgt != PAD].sum().backward()
    params = dict(model.named_parameters())
    keys = key_bias_segments(model)
    assert len(keys) == 2 + 2 + 2  # make_model: 2 + 2 layers
    for name, seg in keys.items():
        grad = params[name].grad
        rest = torch.ones(len(grad), dtype=torch.bool, device=grad.device)
        rest[seg] = False
        assert grad[seg].abs().max() <= 1e-4 * grad[rest].abs().max(), name
