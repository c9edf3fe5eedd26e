"""The documentation's reference pages, generated from the code at every build: the config
keys from the fields of mt/config's sections, the commands from the Typer app's own --help, the
environment variables from mt/runtime/env.py and the exit statuses from mt/cli/app.py. A key
or a flag added to the code appears in the docs without anyone editing them.

`python scripts/docs_reference.py` writes them into docs/reference/, where they are
committed, so that docs/ reads as Markdown without mkdocs; mkdocs.yml loads this file as a
hook whose `on_files` fails the build where a committed page no longer matches the code.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

# The pages this module writes, under the docs folder.
PAGES = {
    "reference/config.md": "config_reference",
    "reference/commands.md": "command_reference",
    "reference/environment.md": "environment_reference",
    "reference/http-api.md": "http_reference",
}


# --- the config ------------------------------------------------------------------------------


def config_keys() -> list[tuple[str, Any]]:
    """Every key of the run config as (dotted name, pydantic FieldInfo), sections in order."""
    from pydantic import BaseModel

    from mt.config.schema import Config

    keys: list[tuple[str, Any]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        later = []  # a section's own keys first, then the sections inside it
        for name, field in model.model_fields.items():
            if _section_model(field.annotation) is None:
                keys.append((prefix + name, field))
            else:
                later.append((name, field))
        for name, field in later:
            if prefix:
                keys.append((prefix + name, field))
            walk(_section_model(field.annotation), f"{prefix}{name}.")

    walk(Config, "")
    return keys


def _section_model(annotation: Any) -> Any:
    from pydantic import BaseModel

    for kind in (annotation, *typing.get_args(annotation)):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return "choice"
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or unset" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if isinstance(annotation, type):
        if _section_model(annotation) is not None:
            return "section"
        return {"str": "text", "int": "whole number", "float": "number", "bool": "true/false"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _allowed(field: Any) -> str:
    args = typing.get_args(field.annotation)
    if typing.get_origin(field.annotation) is Literal:
        return ", ".join(f"`{_yaml(a)}`" for a in args)
    choices = [c for a in args if typing.get_origin(a) is Literal for c in typing.get_args(a)]
    if choices:  # a number or a word (train.pack_width: a width or auto)
        return ", ".join(f"`{_yaml(c)}`" for c in choices) + " or a number"
    bounds = []
    for rule in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(rule, attr, None)
            if value is not None:
                bounds.append(f"{sign} {_yaml(value)}")
    return ", ".join(bounds)


def _default(field: Any) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def _yaml(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, float) and "e" in repr(value):
        mantissa, exponent = repr(value).split("e")
        return f"{float(mantissa)}e{exponent}"  # 1.0e-09: YAML reads it as a number, 1e-09 not
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    keys = config_keys()
    lines = [
        "# Config reference",
        "",
        "Every key of a run config, generated from the sections in `mt/config/` when the docs are "
        "built. A config is YAML with these sections; any key can also be set on the command "
        "line by its dotted name (`mt train CONFIG --set train.max_steps=2000 model.dropout=0.2`). "
        "Unknown keys, wrong types and values outside the allowed ones are refused with a "
        "one-line error naming the key. A section or key left out takes its default. The "
        "[configs guide](../configs.md) says how the keys work together.",
        "",
    ]
    header = ["| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
    section = None
    for name, field in keys:
        if _section_model(field.annotation) is not None:  # a section inside a section
            section = name
            lines += ["", f"## `{name}`", "", _cell(field.description or ""), "", *header]
            continue
        head = name.rsplit(".", 1)[0]
        if head != section:
            section = head
            lines += ["", f"## `{head}`", "", *header]
        default = "required" if field.is_required() else f"`{_yaml(_default(field))}`"
        lines.append(
            f"| `{name}` | {_type_name(field.annotation)} | {default} | "
            f"{_cell(_allowed(field))} | {_cell(field.description or '')} |"
        )
    return "\n".join(lines) + "\n"


# --- the commands ----------------------------------------------------------------------------


def commands() -> dict[str, Any]:
    """The `mt` commands as click commands, by name, in the order --help lists them."""
    import typer

    from mt.cli import app

    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def command_reference() -> str:
    import click
    import typer

    from mt.cli import app
    from mt.cli.app import EXIT_STATUSES

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="mt", terminal_width=100)
    found = commands()
    lines = [
        "# Command reference",
        "",
        "Every `mt` command's `--help`, generated from the command line's own definitions "
        "when the docs are built. `python -m mt ...` is the same as `mt ...`; `mt --version` "
        "prints the version. The [commands guide](../commands.md) shows each one at work.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for name, cmd in found.items():
        first = (cmd.help or "").strip().split("\n\n")[0].replace("\n", " ")
        lines.append(f"| [`mt {name}`](#mt-{name}) | {_cell(first)} |")
    for name, cmd in found.items():
        ctx = click.Context(cmd, info_name=name, parent=root, terminal_width=100)
        lines += ["", f"## `mt {name}`", "", "```text", cmd.get_help(ctx).rstrip(), "```"]
    lines += [
        "",
        "## Exit statuses",
        "",
        "Every command ends with one of these; an error is one line on standard error, "
        "never a traceback.",
        "",
        "| status | meaning |",
        "|---|---|",
    ]
    lines += [f"| {code} | {_cell(text)} |" for code, text in sorted(EXIT_STATUSES.items())]
    return "\n".join(lines) + "\n"


# --- the environment -------------------------------------------------------------------------


def environment_reference() -> str:
    from mt.runtime.env import TEXT_VARIABLES, VARIABLES

    lines = [
        "# Environment variables",
        "",
        "The variables `mt` reads, generated from `mt/runtime/env.py`. Each is checked before "
        "a command starts its work: a number that is not a whole number in range is refused "
        "in one line naming the variable.",
        "",
        "| variable | default when unset | values | what it is |",
        "|---|---|---|---|",
    ]
    for name, (default, minimum, maximum, means) in VARIABLES.items():
        lines.append(f"| `{name}` | {default} | {minimum} to {maximum} | {_cell(means)} |")
    for name, means in TEXT_VARIABLES.items():
        lines.append(f"| `{name}` | unset | (text) | {_cell(means)} |")
    lines += [
        "",
        "Variables of the libraries underneath that matter to `mt`:",
        "",
        "| variable | effect |",
        "|---|---|",
        "| `HF_HUB_OFFLINE=1` | `mt download NAME` without `--from-dir` fails at once instead "
        "of after retries when there is no network |",
        "| `THP_MEM_ALLOC_ENABLE` | `mt train` and `mt pretrain` set it to 1 (transparent huge "
        "pages for large CPU tensors, less memory) unless it is set; `0` opts out |",
        "| `CUDA_VISIBLE_DEVICES` | which GPUs a process sees; under `torchrun` one process "
        "per GPU |",
    ]
    return "\n".join(lines) + "\n"


# --- the HTTP API of mt serve ----------------------------------------------------------------


def openapi() -> dict[str, Any]:
    """mt serve's OpenAPI schema, from an app built around no model (the schema depends on
    the routes and the request and answer models only)."""
    from mt.serve.app import Limits, Served, create_app
    from mt.serve.batcher import Batcher

    batcher = Batcher(lambda sentences, settings, stopped: [])
    try:
        app = create_app(Served("model", None, {}, batcher), Limits())
        return app.openapi()
    finally:
        batcher.close(5)


def _schema_type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop:
        return " or ".join(_schema_type(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"list of {_schema_type(prop.get('items', {}))}"
    return str(prop.get("type", "any"))


def _properties(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else f"`{prop.get('default')}`"
        what = _cell(prop.get("description", "")).replace("<", "&lt;").replace(">", "&gt;")
        rows.append(f"| `{name}` | {_schema_type(prop)} | {default} | {what} |")
    return rows


def http_reference() -> str:
    schema = openapi()
    lines = [
        "# HTTP API",
        "",
        "The routes of `mt serve`, generated from its OpenAPI schema (which the server also "
        "gives at `/openapi.json`). Every error is the JSON body [ErrorBody](#errorbody); the "
        "statuses each route may answer are listed under it.",
        "",
    ]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            lines += [f"## `{method.upper()} {path}`", "", op.get("summary", ""), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| query parameter | what it is |", "|---|---|"]
                lines += [f"| `{p['name']}` | {_cell(p.get('description', ''))} |" for p in params]
                lines.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                lines += ["Body (`Content-Type: application/json`):", ""]
                lines += [*_properties(body["schema"]), ""]
            lines += ["| status | what it means | body |", "|---|---|---|"]
            for status, answer in op["responses"].items():
                content = answer.get("content", {})
                kind = next(iter(content), "")
                shape = content.get(kind, {}).get("schema", {})
                what = _schema_type(shape) if shape else "-"
                if kind and kind != "application/json":
                    what = f"`{kind}`"
                lines.append(f"| {status} | {_cell(answer.get('description', ''))} | {what} |")
            lines.append("")
    lines += ["## Bodies", ""]
    for name, part in sorted(schema["components"]["schemas"].items()):
        if name in ("HTTPValidationError", "ValidationError"):
            continue
        lines += [f"### {name}", ""]
        if part.get("description"):
            lines += [_cell(part["description"]), ""]
        lines += [*_properties(part), ""]
    return "\n".join(lines).rstrip() + "\n"


# --- mkdocs ----------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: the generated pages are committed in docs/reference/ (so that docs/ reads
    as Markdown too); a page that no longer matches the code fails the build."""
    stale = [path for path, text in pages().items() if _committed(path) != text]
    if stale:
        raise SystemExit(
            f"docs: {', '.join(stale)} out of date with the code: run "
            f"python scripts/docs_reference.py docs"
        )
    return files


def pages() -> dict[str, str]:
    """Each generated page's path under docs/ and its text."""
    return {path: globals()[function]() for path, function in PAGES.items()}


def _committed(path: str) -> str | None:
    target = Path(__file__).resolve().parents[1] / "docs" / path
    return target.read_text(encoding="utf-8") if target.is_file() else None


def main(out: str) -> None:
    for path, text in pages().items():
        target = Path(out) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(target)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (this tree's mt)
    main(sys.argv[1] if len(sys.argv) > 1 else "docs")
