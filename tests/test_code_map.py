"""The shape of mt/ as docs/code_map.md describes it: every module named in the
code map, and functions and files of a size a reader can hold."""

from __future__ import annotations

from tests.conftest import ROOT


def test_the_code_map_names_every_module():
    text = (ROOT / "docs/code_map.md").read_text(encoding="utf-8")
    missing = [
        rel
        for path in sorted((ROOT / "mt").rglob("*.py"))
        if path.name != "__init__.py"
        and f"`{(rel := path.relative_to(ROOT / 'mt').as_posix())}`" not in text
        and f"`mt/{rel}`" not in text
    ]
    assert not missing, f"docs/code_map.md does not name: {', '.join(missing)}"


def test_every_file_the_code_map_names_exists():
    """The converse: a module moved or removed leaves no sentence about it behind (names are
    under mt/ or the repository's root)."""
    import re

    text = (ROOT / "docs/code_map.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/.\-]+\.(?:py|md|sh|yaml))`", text))
    gone = sorted(n for n in named if not (ROOT / "mt" / n).exists() and not (ROOT / n).exists())
    assert len(named) > 50 and not gone, f"docs/code_map.md names what is not there: {gone}"


def test_every_function_fits_a_screen_and_every_file_a_sitting():
    """No function in mt/ over 50 lines (its signature and docstring included), no file over
    400: past that a reader loses the thread."""
    import ast

    too_long = []
    for path in sorted((ROOT / "mt").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        if len(source.splitlines()) > 400:
            too_long.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 50:
                    too_long.append(f"{name}:{node.name}: {lines} lines")
    assert not too_long, "; ".join(too_long)
