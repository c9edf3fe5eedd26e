"""docs/code_map.md names every module of mt/: a module added without its line fails here."""

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
