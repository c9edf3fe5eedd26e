"""The folders of mt/ import one way: the graph of which package imports which, imports inside
functions included, has no circle, and is the one docs/code_map.md tables."""

from __future__ import annotations

import ast

from tests.conftest import ROOT


def package_imports() -> dict[str, set[str]]:
    """mt's packages (and top-level modules), each with the others it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "mt").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        here = parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                if node.module == "mt":  # from mt import fast
                    names = [f"mt.{a.name}" for a in node.names]
            for name in names:
                if name.startswith("mt.") and (there := name.split(".")[1]) != here:
                    graph.setdefault(here, set()).add(there)
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph, as a path that comes back to its start, or None."""
    state: dict[str, int] = {}  # 1: on the path now, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_the_packages_import_one_way():
    graph = package_imports()
    assert {"model", "data", "config", "train"} <= set(graph)  # (the graph was read)
    assert circle(graph) is None, " -> ".join(circle(graph) or [])


def test_a_circle_is_found():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None


SHARED = {"tokens", "errors", "outputs"}  # (top-level modules every folder may use)


def test_the_code_map_tables_the_imports_the_code_makes():
    """Each row of docs/code_map.md's import table is what that folder's code imports (a
    folder that gains or drops an import changes its row), and every module the map names
    exists."""
    import re

    text = (ROOT / "docs/code_map.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \|([^|\n]*)\|$", text, re.M)
    table = {folder: set(re.findall(r"`(\w+)`", uses)) for folder, uses in rows}
    graph = package_imports()
    folders = {p.name for p in (ROOT / "mt").iterdir() if (p / "__init__.py").is_file()}
    assert set(table) == folders, set(table) ^ folders
    for folder in sorted(folders):
        made = graph.get(folder, set()) - SHARED
        assert table[folder] == made, (
            folder,
            "missing",
            made - table[folder],
            "untrue",
            table[folder] - made,
        )
    named = set(re.findall(r"`(?:mt/)?((?:\w+/)?\w+\.(?:py|html))`", text))
    missing = [n for n in sorted(named) if not (ROOT / "mt" / n).is_file() | (ROOT / n).is_file()]
    assert not missing, missing
