"""Loading a run configuration: a YAML file (or a built-in config by name) plus `--set
a.b=value` overrides, validated into a Config with one-line errors that name the key and the
nearest valid one; saving it, and comparing two."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from mt.config.schema import Config
from mt.errors import MTError, first_line, shorten
from mt.outputs import atomic_file


def _section_class(loc: tuple[str, ...]) -> type[BaseModel] | None:
    cls: type[BaseModel] = Config
    for part in loc:
        field = cls.model_fields.get(str(part))
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return cls if part == loc[-1] else None
        cls = field.annotation
    return cls


def _sections_with(name: str) -> list[str]:
    """The sections that have a setting called `name`."""
    out = []
    for section, field in Config.model_fields.items():
        cls = field.annotation
        if isinstance(cls, type) and issubclass(cls, BaseModel) and name in cls.model_fields:
            out.append(section)
    return out


def _describe(err: ErrorDetails) -> str:
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        elsewhere = _sections_with(loc[-1])
        if elsewhere and (len(loc) == 1 or elsewhere != [loc[0]]):
            where = " or ".join(f"{section}.{loc[-1]}" for section in elsewhere)
            return f"{key}: unknown key here; it is a setting of another section: {where}"
        parent = _section_class(loc)
        hint = ""
        if parent is not None:
            close = _closest(loc[-1], list(parent.model_fields))
            valid = ", ".join(parent.model_fields)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (valid keys: {valid})"
        return f"{key}: unknown key{hint}"
    if err["type"] == "model_type" and len(loc) == 1:  # (a section written as a value)
        return f"{key}: expected a section of settings (key: value lines), not {err.get('input')!r}"
    if err["type"] == "string_type" and isinstance(err.get("input"), bool):
        return (
            f"{key}: YAML reads an unquoted yes, no, on, off, true or false as a boolean "
            f'({err["input"]}), not text: quote it, as in {loc[-1]}: "no"'
        )
    msg = err["msg"]
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        return msg if not loc or msg.startswith(key + ".") else f"{key}: {msg}"
    return f"{key}: {msg} (got {shorten(repr(err.get('input')))})"


def validate(raw: dict[str, Any], source: str) -> Config:
    if not isinstance(raw, dict):
        raise MTError(
            f"{source}: the config must be a YAML mapping of sections "
            f"(data, tokenizer, model, train, decode)"
        )
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        first = _describe(e.errors()[0])
        more = len(e.errors()) - 1
        raise MTError(
            f"{source}: {first}" + (f" (and {more} more problem(s))" if more else "")
        ) from None


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise MTError(f"--set {text!r}: expected KEY=VALUE, e.g. --set train.max_steps=1000")
    key, value = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise MTError(f"--set {text!r}: the key must be a dotted path like model.d_model")
    return parts, _parse_value(value.strip())


def _parse_value(text: str) -> Any:
    # Not yaml.safe_load: YAML 1.1 reads `no`/`on` as booleans, which breaks language codes.
    lowered = text.lower()
    if text.startswith("["):  # a list: --set decode.tune_beams=[1,5,10]
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise MTError(
                f"--set value {text!r} is not a valid list; write it like [1,5,10]"
            ) from None
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~", ""):  # as YAML: `none` is a string (attention: none)
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _closest(key: str, fields: list[str]) -> list[str]:
    """The field a mistyped key most likely meant: one the key starts with or that starts
    with it (warmup_steps: warmup, as other toolkits spell it), else difflib's nearest."""
    prefixed = [f for f in fields if key.startswith(f) or f.startswith(key)]
    if prefixed:
        return [max(prefixed, key=len)]
    return difflib.get_close_matches(key, fields, n=1)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = _deep_copy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise MTError(f"--set {text!r}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return raw


def _deep_copy(d: Any) -> Any:
    return {k: _deep_copy(v) for k, v in d.items()} if isinstance(d, dict) else d


BUILTIN_DIR = Path(__file__).parent.parent / "configs"


def builtin_configs() -> dict[str, Path]:
    """The configs shipped inside the package, by name (tiny, multi30k_de_en, ...)."""
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.yaml"))}


def describe_config(path: Path) -> str:
    """A config's first comment line: what it is for."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip().split(": ")[0].rstrip(":")
        if line.strip():
            break
    return ""


def find_config(name: str | Path, log: Callable[[str], None] | None = None) -> Path:
    """An existing YAML file; else a built-in config, by its bare name (`tiny`) or as
    `configs/NAME.yaml` (the README's examples, from any folder), said to `log` in one line.
    Any other missing path is an error naming it (a typo in a folder must not train `tiny`)."""
    path = Path(name)
    if path.is_file():
        return path
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    builtin = builtin_configs().get(stem)
    as_written = path.as_posix()
    if path.is_dir() and not (builtin is not None and as_written == stem):
        hint = (
            f"; to resume that run: mt train {path / 'config.yaml'} --run-dir {path}"
            if (path / "config.yaml").is_file()
            else ""
        )
        raise MTError(f"config {name} is a folder: give a YAML file{hint}")
    if builtin is not None and as_written in (stem, f"configs/{stem}.yaml"):
        if log is not None:
            where = "" if as_written == stem else f"{name} is not in {Path.cwd()}: "
            log(f"{where}using the built-in config {stem} ({builtin})")
        return builtin
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        raise MTError(f"config file {name} not found (in {Path.cwd()}); check the path")
    names = ", ".join(builtin_configs())
    raise MTError(
        f"config {name} not found: pass the path to a YAML file or the name of a "
        f"built-in config ({names}; `mt configs` lists them)"
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key written twice in one mapping (PyYAML keeps the last one
    silently: a second `train:` section would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in first:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} is written twice in one section (first on line {first[key] + 1}); "
                    f"the second would replace the first: merge them",
                    key_node.start_mark,
                )
            if isinstance(key, str | int | float | bool):
                first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> Any:
    """A YAML file's contents; a syntax error names its line and column, an empty file is an
    error (it is never taken as all defaults)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MTError(f"{path}: not valid UTF-8 at byte {e.start}; save it as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        cause = e.problem or e.context or "syntax error"
        raise MTError(f"{path}{where}: not valid YAML ({cause})") from None
    except yaml.YAMLError as e:
        raise MTError(f"{path}: not valid YAML ({first_line(e)})") from None
    if raw is None:
        raise MTError(
            f"{path}: the config file is empty; copy a built-in config (`mt configs` lists "
            f"them) and change what you need"
        )
    return raw


def load_config(
    path: str | Path, overrides: Sequence[str] = (), log: Callable[[str], None] | None = None
) -> Config:
    """The config at `path` (find_config) with `--set` overrides; log: where a built-in
    config's use is said. A setting the user wrote that the architecture ignores is refused
    (READ_BY_ARCH): --set's against the final model.arch, the file's against the file's own
    (unless --set changes model.arch: then the file's settings for another one stay aside).
    The defaults are never checked so (config.yaml and checkpoints hold them all). The
    settings an imported model fixes (model.init_from) are applied where the run is built
    (mt.train.build.load_run_config), with written_settings."""
    return read_config(path, overrides, log)[0]


def read_config(
    path: str | Path, overrides: Sequence[str] = (), log: Callable[[str], None] | None = None
) -> tuple[Config, set[str], str]:
    """(load_config's Config, the dotted keys the user wrote in the file or with --set, where
    the config came from)."""
    path = find_config(path, log)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        return validate(raw, str(path)), set(), str(path)
    cfg = validate(raw, str(path))  # file errors are reported against the file
    written = {".".join(parse_override(o)[0]) for o in overrides}
    saved = path.read_text(encoding="utf-8").startswith(SAVED_HEADER)  # (a run's own)
    in_file = set() if saved else _written(raw)
    if "model.arch" not in written:  # (--set model.arch: the file's own)
        check_written(in_file, cfg, str(path))
    if overrides:
        cfg = validate(apply_overrides(raw, list(overrides)), "--set")
        check_written(written, cfg, "--set")
    return cfg, in_file | written, str(path)


# the settings that only some architectures read, and which (model.arch); the others ignore
# them, so a config that writes one for another architecture says one thing and does another
_TRANSFORMER_KEYS = (
    "n_heads",
    "d_ff",
    "attn_dropout",
    "act_dropout",
    "norm",
    "positional",
    "max_relative",
    "activation",
    "output_bias",
)
_NAT_KEYS = ("nat_iterations", "nat_length_beam", "tune_nat_length_beams", "tune_nat_iterations")
READ_BY_ARCH: dict[str, tuple[str, ...]] = {
    "model.attention": ("rnn",),
    **{f"model.{key}": ("transformer", "decoder_only", "nat") for key in _TRANSFORMER_KEYS},
    "model.enc_layers": ("transformer", "rnn", "nat"),
    **{f"decode.{key}": ("nat",) for key in _NAT_KEYS},
}


def _written(raw: dict[str, Any]) -> set[str]:
    """The dotted keys of the settings in a config file (section.key)."""
    return {
        f"{section}.{key}"
        for section, values in raw.items()
        if isinstance(values, dict)
        for key in values
    }


def check_written(keys: set[str], cfg: Config, source: str) -> None:
    """Refuse a setting the user wrote (`keys`, dotted) that cfg's model.arch never reads."""
    arch = cfg.model.arch
    for key in sorted(keys):
        archs = READ_BY_ARCH.get(key)
        if archs is not None and arch not in archs:
            raise MTError(
                f"{source}: {key} applies to model.arch {' or '.join(archs)}; this config "
                f"trains model.arch {arch}, which ignores it: remove {key}, or set model.arch"
            )
    if "model.max_relative" in keys and cfg.model.positional != "relative":
        raise MTError(
            f"{source}: model.max_relative applies to model.positional relative (this config "
            f"has {cfg.model.positional}): remove it, or set model.positional: relative"
        )


def config_from_dict(raw: dict[str, Any], source: str = "checkpoint") -> Config:
    return validate(raw, source)


# the first line of a config that mt wrote whole (a run's config.yaml): every setting is in
# it, defaults included, so its keys are not the user's choices (check_written)
SAVED_HEADER = "# written by mt train: every setting of the run, defaults included\n"


def save_config(cfg: Config, path: Path) -> None:
    """Written whole or not at all (a temp file renamed over `path`): the other ranks of a
    torchrun start read the run's config.yaml while rank 0 writes it."""
    with atomic_file(path, "w") as f:
        f.write(SAVED_HEADER + yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def diff_configs(a: Config, b: Config, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two configs (sections in `ignore` skipped)."""
    out = []
    da, db = a.to_dict(), b.to_dict()
    for section, values in da.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            if name not in ignore and section not in ignore and db[section][key] != value:
                out.append(f"{name}: {db[section][key]!r} -> {value!r}")
    return out


def with_fixed(
    cfg: Config, fixed: dict[str, Any], written: set[str], where: str, source: str
) -> Config:
    """cfg with the dotted settings `fixed` (those the model that model.init_from names
    fixes: `source`); a setting the user wrote (`written`) that says otherwise is refused,
    naming it."""
    for key in sorted(written):
        section, name = key.split(".", 1)
        ours = getattr(getattr(cfg, section), name, None)
        if key in fixed and ours != fixed[key]:
            raise MTError(
                f"{where}: {key} is {ours}, but model.init_from {source} has {fixed[key]}: "
                f"remove {key} (the model it starts from fixes it)"
            )
    raw = cfg.to_dict()
    for key, value in fixed.items():
        section, name = key.split(".")
        raw[section][name] = value
    return config_from_dict(raw, where)
