"""What users do with a trained model: n-best lists, sampling, ensembles, a forced prefix,
through the Python API and `mt translate`."""

import torch

from mt import Sampling, Translator
from mt.artifacts import checkpoint
from mt.data.synthetic import generate
from mt.decode.cache import DecodeCache
from mt.decode.ensemble import Ensemble
from mt.decode.sampling import sampler
from tests.conftest import (
    V,
    assert_user_error,
    beam_nbest,
    beam_search,
    greedy,
    make_model,
    make_src,
    run_mt,
)


def test_nbest_first_is_the_beam_output_and_scores_are_sorted():
    model = make_model()
    src = make_src([7, 4, 9, 5])
    for beam in (2, 5):
        best = beam_search(model, src, src == 0, beam, 1.0)
        lists = beam_nbest(model, src, src == 0, beam, beam, 1.0)
        assert [hyps[0][0] for hyps in lists] == best
        for hyps in lists:
            assert 1 <= len(hyps) <= beam
            scores = [s for _, s in hyps]
            assert scores == sorted(scores, reverse=True)
            assert len({tuple(ids) for ids, _ in hyps}) == len(hyps)  # distinct


def test_sampling_with_top_k_one_or_a_tiny_nucleus_is_greedy():
    model = make_model()
    src = make_src([7, 4, 9, 5])
    expected = greedy(model, src, src == 0)
    g = torch.Generator().manual_seed(0)
    assert greedy(model, src, src == 0, sampling=Sampling(topk=1), generator=g) == expected
    assert greedy(model, src, src == 0, sampling=Sampling(topp=1e-6), generator=g) == expected
    assert (
        greedy(model, src, src == 0, sampling=Sampling(temperature=1e-4), generator=g) == expected
    )


def test_sampler_draws_from_the_renormalised_top_k_and_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lprobs = probs.log().expand(20000, 4).contiguous()
    g = torch.Generator().manual_seed(1)
    drawn = sampler(topk=2, generator=g)(lprobs)
    freq = torch.bincount(drawn, minlength=4).float() / len(drawn)
    assert freq[2] == freq[3] == 0
    assert abs(float(freq[0]) - 0.5 / 0.8) < 0.02
    drawn = sampler(topp=0.9, generator=g)(lprobs)  # 0.5 + 0.3 + 0.15 >= 0.9
    freq = torch.bincount(drawn, minlength=4).float() / len(drawn)
    assert freq[3] == 0 and abs(float(freq[2]) - 0.15 / 0.95) < 0.02
    hot = sampler(temperature=0.5, generator=g)(lprobs)  # sharper: p^2 renormalised
    freq = torch.bincount(hot, minlength=4).float() / len(hot)
    assert abs(float(freq[0]) - 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025)) < 0.02


def test_an_ensemble_of_one_is_the_model_and_of_two_copies_too():
    model = make_model()
    src = make_src([7, 4, 9, 5])
    for ens in (Ensemble([model]), Ensemble([model, make_model()])):
        ens.eval()
        assert greedy(ens, src, src == 0) == greedy(model, src, src == 0)
        assert beam_search(ens, src, src == 0, 4, 1.0) == beam_search(model, src, src == 0, 4, 1.0)
        for (a, sa), (b, sb) in zip(
            beam_nbest(ens, src, src == 0, 3, 3)[0],
            beam_nbest(model, src, src == 0, 3, 3)[0],
            strict=True,
        ):
            assert a == b and abs(sa - sb) < 1e-5


def test_an_ensemble_of_two_different_models_averages_their_log_probabilities():
    a, b = make_model(seed=0), make_model(seed=1)
    ens = Ensemble([a, b]).eval()
    src = make_src([6, 3])
    tgt = torch.randint(4, V, (2, 4))
    with torch.no_grad():
        h = ens.decode(tgt, ens.encode(src, src == 0), src == 0)
        mean = (
            torch.log_softmax(a(src, tgt, src == 0), -1)
            + torch.log_softmax(b(src, tgt, src == 0), -1)
        ) / 2
        torch.testing.assert_close(ens.project(h), mean, rtol=1e-5, atol=1e-5)


def test_api_nbest_sampling_prefix_and_ensemble_on_a_trained_run(tiny_run):
    t = Translator.load(tiny_run, "cpu")
    src, _ = generate(12, seed=3)
    lines = [*src[:6], "", *src[6:]]
    best = t.translate(lines, beam=4)
    nbest = t.translate_nbest(lines, 3, beam=4)
    assert [hyps[0][0] if hyps else "" for hyps in nbest] == best
    assert nbest[6] == [] and all(len(h) == 3 for i, h in enumerate(nbest) if i != 6)
    seeded = t.translate(lines, sampling=Sampling(temperature=1.5, seed=7))
    assert seeded == t.translate(lines, sampling=Sampling(temperature=1.5, seed=7))
    assert t.translate(lines, sampling=Sampling(topk=1, seed=1)) == t.translate(lines, beam=1)
    first = best[0].split()[0]
    prefixed = t.translate(lines, beam=4, prefix=first + " " + first)
    assert all(p.startswith(f"{first} {first}") for i, p in enumerate(prefixed) if i != 6)
    ensemble = Translator.load([tiny_run, tiny_run / "last.pt"], "cpu")
    assert len(ensemble.translate(lines, beam=4)) == len(lines)


def test_translate_cli_nbest_sampling_ensemble_and_bad_flags(tiny_run, tmp_path):
    src, _ = generate(5, seed=4)
    (tmp_path / "in").write_text("\n".join(src) + "\n")
    proc = run_mt("translate", tiny_run, "-i", tmp_path / "in", "--nbest", "3", "--beam", "4")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [i for i in range(5) for _ in range(3)]
    for i in range(5):
        scores = [float(r[1]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True)
    single = run_mt("translate", tiny_run, "-i", tmp_path / "in", "--beam", "4").stdout.splitlines()
    assert [r[2] for r in rows[::3]] == single
    pair = run_mt("translate", tiny_run, tiny_run, "-i", tmp_path / "in", "--beam", "4")
    assert pair.returncode == 0 and pair.stdout.splitlines() == single
    assert "ensemble of 2 models" in pair.stderr
    sampled = run_mt(
        "translate", tiny_run, "-i", tmp_path / "in", "--sample", "--seed", "3", "--topp", "0.8"
    )
    assert sampled.returncode == 0 and len(sampled.stdout.splitlines()) == 5
    assert_user_error(
        run_mt("translate", tiny_run, "--nbest", "9", "--beam", "2", input="a\n"), "--nbest 9"
    )
    assert_user_error(run_mt("translate", tiny_run, "--topk", "3", input="a\n"), "--sample only")
    assert_user_error(
        run_mt("translate", tiny_run, "--sample", "--beam", "3", input="a\n"), "leave out --beam"
    )
    assert_user_error(
        run_mt("translate", tiny_run, "--sample", "--topp", "0", input="a\n"), "--topp"
    )


def test_an_ensemble_needs_one_tokenizer(tiny_run, tmp_path):
    ckpt = checkpoint.load(tiny_run / "last.pt")
    ckpt["spm"]["src"] = ckpt["spm"]["src"].clone()
    ckpt["spm"]["src"][-1] ^= 1  # another BPE model
    checkpoint.atomic_save(ckpt, tmp_path / "other.pt")
    assert_user_error(
        run_mt("translate", tiny_run, tmp_path / "other.pt", input="a\n"),
        "another BPE model",
        "share one tokenizer",
    )


def test_attention_labels_show_words_not_sentencepiece_marks():
    from mt.decode.alignment import readable_pieces

    assert readable_pieces(["\u2581Ein", "\u2581Hund", "e", "\u2581", "</s>"]) == [
        "Ein",
        "Hund",
        "##e",
        "\u2423",
        "</s>",
    ]


def test_overlong_input_is_truncated_with_warning_and_keeps_line_count(tiny_run):
    long_line = " ".join(["lo ka mi"] * 200)  # > max_positions subwords
    proc = run_mt("translate", tiny_run, "--greedy", input=f"mi\n{long_line}\n\ntu\n")
    assert proc.returncode == 0, proc.stderr
    assert "1 input line(s) longer than" in proc.stderr and "truncated" in proc.stderr
    assert len(proc.stdout.split("\n")[:-1]) == 4


def test_sampling_seeds_decide_the_draws_from_the_cli(tiny_run, tmp_path):
    """The same --seed gives the same samples, another seed (or none) other samples: a fixed
    seed in place of the user's would fail here."""
    src, _ = generate(20, seed=5)
    (tmp_path / "in").write_text("\n".join(src) + "\n")

    def sample(*seed):
        flags = ("--sample", "--temperature", "3", *seed)
        proc = run_mt("translate", tiny_run, "-i", tmp_path / "in", *flags)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    three = sample("--seed", "3")
    assert three == sample("--seed", "3")
    assert len({three, sample("--seed", "4"), sample("--seed", "0")}) == 3
    assert sample() != sample()


def test_an_ensemble_of_two_real_checkpoints_decodes_with_the_mean_log_probability(tiny_run):
    """Two snapshots of a trained run: the ensemble's greedy output equals a greedy search
    written out here, each step the argmax of the mean of the members' log-probabilities from
    a full forward pass (no cache), and its n-best scores are that mean's sums."""
    from mt.artifacts import checkpoint
    from mt.tokens import BOS, EOS

    paths = [tiny_run / "step_30.pt", tiny_run / "step_60.pt"]
    members = [checkpoint.open_trained(p).model.eval() for p in paths]
    ens = Translator.load(paths, "cpu")
    src_lines, _ = generate(8, seed=11)
    got = ens.search(src_lines, beam=1)
    for line, (ids, ((out, _),)) in zip(src_lines, got, strict=True):
        src = torch.tensor([[*ids, EOS]])
        tgt = [BOS]
        with torch.no_grad():
            limit = int((len(ids) + 1) * 1.5 + 5)  # tiny.yaml's max_len_a, max_len_b
            while len(tgt) - 1 < limit:
                lp = sum(
                    torch.log_softmax(m(src, torch.tensor([tgt]), src == 0)[0, -1].float(), -1)
                    for m in members
                ) / len(members)
                nxt = int(lp.argmax())
                if nxt == EOS:
                    break
                tgt.append(nxt)
        assert list(out) == tgt[1:], line
        # each step's distribution, decoded with the cache as the search does, is the mean
        model, memory_mask = ens.model, src == 0
        with torch.no_grad():
            memory, cache = model.encode(src, memory_mask), DecodeCache(model.cache_layers)
            for t in range(len(tgt)):
                h = model.decode(torch.tensor([tgt[t : t + 1]]), memory, memory_mask, cache, t)
                mean = sum(
                    torch.log_softmax(m(src, torch.tensor([tgt[: t + 1]]), memory_mask), -1)
                    for m in members
                )[0, -1] / len(members)
                torch.testing.assert_close(model.project(h[:, -1])[0], mean, atol=1e-5, rtol=0)
    single = [Translator.load(p, "cpu").translate(src_lines, beam=1) for p in paths]
    assert single[0] != single[1]  # the members differ, so the mean is not one of them
