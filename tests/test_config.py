import pytest
import torch
from pydantic import ValidationError

from mt.config import apply_overrides, load_config, validate
from mt.errors import MTError
from tests.conftest import (
    ROOT,
    assert_user_error,
    run_mt,
)


def test_shipped_configs_validate():
    for name in ("tiny", "multi30k_de_en", "multi30k_en_de", "wmt14_en_de_base"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        assert cfg.model.d_model % cfg.model.n_heads == 0


def test_base_config_is_the_paper_base_model():
    m = load_config(ROOT / "configs/wmt14_en_de_base.yaml").model
    assert (m.enc_layers, m.dec_layers, m.d_model, m.n_heads, m.d_ff, m.dropout) == (
        6,
        6,
        512,
        8,
        2048,
        0.1,
    )


def test_unknown_key_names_nearest_valid_key():
    with pytest.raises(MTError, match=r"model\.d_modle: unknown key \(did you mean 'd_model'\?\)"):
        validate({"model": {"d_modle": 512}}, "x.yaml")
    with pytest.raises(MTError, match=r"trian: unknown key \(did you mean 'train'\?\)"):
        validate({"trian": {}}, "x.yaml")


def test_wrong_type_names_key():
    with pytest.raises(MTError, match=r"train\.max_steps"):
        validate({"train": {"max_steps": "many"}}, "x.yaml")
    with pytest.raises(MTError, match=r"tokenizer\.joint"):
        validate({"tokenizer": {"joint": "yes"}}, "x.yaml")


def test_a_yaml_boolean_where_text_belongs_is_named_with_the_fix(tmp_path):
    """YAML 1.1 reads an unquoted no (Norwegian), on or off as a boolean: the error says so
    and how to write it, not "a valid string (got False)"."""
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  src_lang: no\n  tgt_lang: en\n")
    with pytest.raises(MTError, match=r'data\.src_lang: YAML reads .* \(False\).* quote it.*"no"'):
        load_config(config)
    config.write_text('data:\n  src_lang: "no"\n  tgt_lang: en\n')
    assert load_config(config).data.src_lang == "no"


@pytest.mark.parametrize(
    "raw,key",
    [
        ({"model": {"d_model": 100, "n_heads": 3}}, "divisible"),
        ({"train": {"warmup": 0}}, "train.warmup"),
        ({"model": {"dropout": 1.0}}, "model.dropout"),
        ({"decode": {"beam": 0}}, "decode.beam"),
        ({"train": {"device": "tpu"}}, "train.device"),
        ({"train": {"bidirectional_share": 1.5}}, "train.bidirectional_share"),
        ({"train": {"word_dropout": 1.0}}, "train.word_dropout"),
        (
            {
                "train": {"bidirectional_share": 0.3},
                "tokenizer": {"joint": False},
                "model": {"tie_embeddings": "decoder"},
            },
            r"needs one vocabulary for both: set tokenizer\.joint",
        ),
    ],
)
def test_impossible_values(raw, key):
    with pytest.raises(MTError, match=key):
        validate(raw, "x.yaml")


def test_config_is_frozen():
    cfg = validate({}, "x")
    with pytest.raises(ValidationError, match="frozen"):
        cfg.train.max_steps = 3


def test_set_overrides_by_dotted_path(tmp_path):
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        ["train.max_steps=7", "data.dir=/x/y", "data.src_lang=no", "model.dropout=0.25"],
    )
    assert cfg.train.max_steps == 7 and cfg.data.dir == "/x/y"
    assert cfg.data.src_lang == "no"  # not YAML's boolean `no`
    assert cfg.model.dropout == 0.25


@pytest.mark.parametrize(
    "override,needle",
    [
        ("train.max_stepz=5", "did you mean 'max_steps'"),
        ("train.max_steps=abc", "train.max_steps"),
        ("max_steps", "KEY=VALUE"),
        ("train.max_steps.x=1", "train.max_steps"),
    ],
)
def test_bad_set_is_rejected(override, needle):
    with pytest.raises(MTError, match=needle.replace(".", r"\.").replace("'", "'")):
        load_config(ROOT / "configs/tiny.yaml", [override])


def test_apply_overrides_does_not_mutate_input():
    raw = {"train": {"max_steps": 1}}
    apply_overrides(raw, ["train.max_steps=2"])
    assert raw == {"train": {"max_steps": 1}}


def test_cli_config_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_modle: 4\n")
    assert_user_error(run_mt("train", bad, "--run-dir", tmp_path / "r"), "did you mean 'd_model'")
    assert_user_error(run_mt("train", tmp_path / "missing.yaml"), "not found")
    assert_user_error(
        run_mt(
            "train",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            tmp_path / "r",
            "--set",
            "train.warmup=0",
        ),
        "train.warmup",
    )


def test_save_config_writes_the_whole_file_or_leaves_the_old_one(tmp_path, monkeypatch):
    """config.yaml is read by the other ranks while rank 0 writes it: a reader must never
    see half a file, so a write that fails leaves the old one whole and no temp file."""
    import yaml

    from mt.config import save_config

    cfg = load_config(ROOT / "configs/tiny.yaml")
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    before = path.read_text(encoding="utf-8")
    assert load_config(path) == cfg

    real_dump = yaml.safe_dump
    # text that fails to encode at its end: the write dies after the file was opened
    monkeypatch.setattr(yaml, "safe_dump", lambda *a, **k: real_dump(*a, **k) + "\udc80")
    with pytest.raises(UnicodeEncodeError):
        save_config(cfg, path)
    assert path.read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


TINY = ROOT / "configs" / "tiny.yaml"


def test_max_len_beyond_max_positions_is_a_config_error():
    with pytest.raises(
        MTError, match=r"data\.max_len \(300\) does not fit model\.max_positions \(256\)"
    ):
        load_config(TINY, ["data.max_len=300"])
    with pytest.raises(MTError, match=r"twice data\.max_len"):
        load_config(TINY, ["model.arch=decoder_only", "data.max_len=200"])
    assert load_config(TINY, ["model.arch=decoder_only", "data.max_len=128"]).max_side_len == 128
    assert load_config(TINY, ["model.arch=rnn", "data.max_len=300"])  # no position table


def test_a_missing_config_path_is_an_error_not_a_builtin(tmp_path):
    """Only a bare name or exactly configs/NAME.yaml finds a built-in config; a typo in any
    other path names the path and trains nothing."""
    proc = run_mt("train", "prj/configs/tiny.yaml", cwd=tmp_path)
    assert_user_error(proc, "prj/configs/tiny.yaml", "not found")
    assert_user_error(run_mt("train", "tiny.yaml", cwd=tmp_path), "tiny.yaml", "not found")
    assert not (tmp_path / "runs").exists()
    run = tmp_path / "runs/old"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("data: {}\n")
    assert_user_error(
        run_mt("train", run, cwd=tmp_path), "is a folder", f"config.yaml --run-dir {run}"
    )


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("model:\n  d_model: 64\n   n_heads: 4\n", ["bad.yaml:3:", "not valid YAML", "mapping"]),
        ("train: {max_steps: 3\n", ["bad.yaml:2:", "not valid YAML", "expected ','"]),
        ("", ["bad.yaml", "is empty"]),
        ("# only a comment\n", ["bad.yaml", "is empty"]),
        ("\ufeffmodel: [1\n", ["bad.yaml:", "not valid YAML"]),
        (b"model:\n  d_model: \xff\n", ["bad.yaml", "not valid UTF-8"]),
    ],
)
def test_yaml_errors_name_line_and_column_and_an_empty_file_is_refused(tmp_path, text, needles):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    proc = run_mt("train", bad, "--run-dir", tmp_path / "r")
    assert_user_error(proc, *needles)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_byte_order_mark_before_a_config_is_ignored(tmp_path):
    from mt.config.load import read_yaml

    path = tmp_path / "c.yaml"
    path.write_bytes("\ufefftrain: {max_steps: 3}\n".encode())
    assert read_yaml(path) == {"train": {"max_steps": 3}}


def test_compile_is_refused_with_ddp_in_one_line():
    with pytest.raises(MTError, match=r"train\.compile: true does not apply with train\.data_par"):
        load_config(ROOT / "configs/tiny.yaml", ["train.compile=true", "train.data_parallel=ddp"])


def test_compile_and_forced_fast_paths_are_refused_together():
    with pytest.raises(MTError, match="two ways to a fast step"):
        load_config(ROOT / "configs/tiny.yaml", ["train.compile=true", "train.fast_paths=true"])
    cfg = load_config(ROOT / "configs/tiny.yaml", ["train.compile=true"])  # auto steps aside
    from mt.model import REFERENCE
    from mt.train.parts import for_device, model_parts

    cpu = torch.device("cpu")
    plain = load_config(ROOT / "configs/tiny.yaml")
    for given, fast in ((cfg, False), (plain, True)):
        t = for_device(given, cpu)[0].train
        assert (model_parts(t, cpu, compile=bool(t.compile)) is not REFERENCE) is fast


@pytest.mark.parametrize(
    "sets, device, compiles",
    [
        (["train.compile=false"], "cuda", False),
        (["train.compile=true"], "cpu", True),
        (["train.compile=auto"], "cpu", False),  # the CPU keeps mt/fast
        (["train.compile=auto"], "cuda", True),
        (["train.compile=auto", "model.arch=decoder_only"], "cuda", True),
        (["train.compile=auto", "train.rdrop_alpha=1.0"], "cuda", False),
        (
            [
                "train.compile=auto",
                "train.scheduled_sampling.schedule=exponential",
                "train.scheduled_sampling.k=0.999",
            ],
            "cuda",
            False,
        ),
        (["train.compile=auto", "model.arch=nat"], "cuda", False),
        (["train.compile=auto", "model.arch=rnn"], "cuda", False),
        (["train.compile=auto", "train.fast_paths=true"], "cuda", False),  # no contradiction
        (["train.compile=auto", "train.data_parallel=ddp"], "cuda", False),  # DDP runs eager
    ],
)
def test_compile_auto_is_on_where_it_pays_and_never_a_contradiction(sets, device, compiles):
    from mt.train.parts import compile_applies

    cfg = load_config(ROOT / "configs/tiny.yaml", sets)
    assert compile_applies(cfg, torch.device(device)) is compiles
    assert compile_applies(cfg, torch.device(device), pretraining=True) is False


def test_compile_takes_auto_or_a_boolean_not_a_number():
    with pytest.raises(MTError, match="not the number 1"):
        load_config(ROOT / "configs/tiny.yaml", ["train.compile=1"])


def test_a_config_that_says_one_thing_and_trains_another_is_refused(tmp_path):
    """A key written twice (PyYAML keeps the last), and a setting written for another
    architecture than the one trained, are refused in one line naming them; the file's
    settings are checked against the file's architecture, --set's against the final one."""
    from mt.config import load_config
    from mt.errors import MTError

    twice = tmp_path / "twice.yaml"
    twice.write_text("train:\n  max_steps: 10\nmodel:\n  d_model: 64\ntrain:\n  max_steps: 20\n")
    with pytest.raises(MTError, match=r"twice.yaml:5:1: .*'train' is written twice"):
        load_config(twice)
    nested = tmp_path / "nested.yaml"
    nested.write_text("model:\n  d_model: 64\n  d_model: 128\n")
    with pytest.raises(MTError, match=r"nested.yaml:3:3: .*'d_model' is written twice"):
        load_config(nested)
    tiny = ROOT / "configs/tiny.yaml"
    with pytest.raises(MTError, match=r"--set: model.attention applies to model.arch rnn"):
        load_config(tiny, ["model.attention=bahdanau"])  # (the default value, written)
    with pytest.raises(MTError, match=r"model.n_heads applies to .*trains model.arch rnn"):
        load_config(tiny, ["model.arch=rnn", "model.n_heads=2"])
    with pytest.raises(MTError, match=r"model.max_relative applies to model.positional"):
        load_config(tiny, ["model.max_relative=8"])
    with pytest.raises(MTError, match=r"decode.nat_iterations applies to model.arch nat"):
        load_config(tiny, ["decode.nat_iterations=4"])
    in_file = tmp_path / "rnn_attention.yaml"
    in_file.write_text("model:\n  attention: bahdanau\n")
    with pytest.raises(MTError, match=r"rnn_attention.yaml: model.attention applies to"):
        load_config(in_file)
    assert load_config(in_file, ["model.arch=rnn"]).model.arch == "rnn"
    # the file's Transformer settings stay aside when --set picks another architecture
    assert load_config(tiny, ["model.arch=rnn", "model.attention=luong"]).model.arch == "rnn"
    for name in ("tiny", "multi30k_de_en", "multi30k_en_de", "wmt14_en_de_base"):
        load_config(ROOT / f"configs/{name}.yaml")  # (the shipped configs pass)
    # a run's config.yaml holds every setting, defaults included: it is read as it was saved
    from mt.config import save_config

    save_config(load_config(tiny), tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == load_config(tiny)


def test_a_key_in_the_wrong_section_names_the_section_it_belongs_to():
    from mt.config import load_config
    from mt.errors import MTError

    tiny = ROOT / "configs/tiny.yaml"
    for override, says in (
        ("train.dropout=0.3", "train.dropout: unknown key here; it is a setting of another "
         "section: model.dropout"),
        ("max_steps=5", "max_steps: unknown key here; it is a setting of another section: "
         "train.max_steps"),
        ("dropout=0.3", "it is a setting of another section: model.dropout"),
        ("model=128", "model: expected a section of settings"),
        ("train.max_stepz=3", "did you mean 'max_steps'?"),
    ):  # fmt: skip
        with pytest.raises(MTError) as e:
            load_config(tiny, [override])
        assert says in str(e.value), str(e.value)


def _numeric_keys():
    """Every number a config holds, found from the schema: (section.key, int or float, list)."""
    import typing

    from mt.config import Config

    for section, field in Config.model_fields.items():
        for key, f in field.annotation.model_fields.items():
            kinds = typing.get_args(f.annotation) or (f.annotation,)
            inner = [typing.get_args(k) for k in kinds if typing.get_origin(k) is list]
            found = [k for k in (*kinds, *(a for args in inner for a in args)) if k in (int, float)]
            if found:
                yield f"{section}.{key}", found[0], bool(inner)


@pytest.mark.parametrize("huge", ["1" + "0" * 30, "-1" + "0" * 30, "9" * 400, "1e300", "-1e300"])
def test_every_number_in_a_config_has_bounds_named_in_one_line(huge):
    """A value no run can use (a count of 10^30, a width of 1e300, a 400-digit string) is a
    one-line error naming the key, for every numeric key of every section (found from the
    schema, lists of numbers included)."""
    keys = list(_numeric_keys())
    assert len(keys) >= 50, keys
    for key, _, is_list in keys:
        override = f"{key}=[{huge}]" if is_list else f"{key}={huge}"
        try:
            load_config(ROOT / "configs/tiny.yaml", [override])
        except MTError as e:
            message = str(e)
        else:
            raise AssertionError(f"{override} was taken")
        assert key.split(".")[-1] in message and "\n" not in message, (key, message)
        assert len(message) < 400, message


def test_set_options_apply_in_command_line_order(monkeypatch):
    """However --set and the KEY=VALUE after it are arranged (a --set before every override,
    or several after one), the overrides reach the config in command-line order: the later of
    two settings of a key wins, as config.yaml then says."""
    import itertools

    import mt.train.build
    from mt.config.load import apply_overrides
    from tests.conftest import mt_here

    seen = []

    def load_run_config(path, overrides, log=None):
        seen.append(list(overrides))
        raise MTError("stop here")

    monkeypatch.setattr(mt.train.build, "load_run_config", load_run_config)
    settings = ["train.max_steps=3", "train.device=cpu", "train.max_steps=5", "train.seed=7"]
    for order in itertools.permutations(settings):
        for marks in itertools.product([True, False], repeat=len(order) - 1):
            args = ["--set", order[0]]
            for mark, s in zip(marks, order[1:], strict=True):
                args += ["--set", s] if mark else [s]
            seen.clear()
            code, _, err = mt_here("train", "tiny", *args)
            assert code == 2 and "stop here" in err
            steps = [s for s in order if s.startswith("train.max_steps")][-1].split("=")[1]
            got = apply_overrides({}, seen[0])
            assert got["train"]["max_steps"] == int(steps), args
            assert seen[0] == list(order), args


def test_the_same_language_on_both_sides_is_refused():
    """data.tgt_lang=src trained a model that copies its input (valid BLEU 99.72) without a
    word; data.pairs [en-en] was refused already."""
    with pytest.raises(MTError, match=r"both 'src'.*copy its input"):
        load_config(ROOT / "configs/tiny.yaml", ["data.tgt_lang=src"])
    load_config(ROOT / "configs/tiny.yaml", ["data.tgt_lang=tgt"])  # (the toy task's own)
