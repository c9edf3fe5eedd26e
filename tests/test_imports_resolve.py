"""Code that only a GPU machine runs (tests/test_cuda.py, scripts/ and the Python inside the
shell scripts) is never imported by the default suite, so a module moved or a name renamed
would rot there unseen: every import it makes, at the top or inside a function, is resolved
here, module and names, without running any of it."""

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# a heredoc fed to Python (python3 - ARGS <<'EOF' ... EOF) and a one-line python3 -c "..."
_HEREDOC = re.compile(r"python3? -[^\n]*<<-?'?(\w+)'?\n(.*?)\n\1\n", re.S)
_ONE_LINE = re.compile(r"python3? -c \"([^\"$]*)\"")


def python_sources() -> list[tuple[str, str, Path]]:
    """(a label, the Python source, the folder its own modules are imported from)."""
    files = [*sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "scripts").rglob("*.py"))]
    out = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"), p.parent) for p in files]
    for sh in sorted((ROOT / "scripts").rglob("*.sh")):
        text = sh.read_text(encoding="utf-8")
        for i, m in enumerate(_HEREDOC.finditer(text)):
            out.append((f"{sh.relative_to(ROOT)} heredoc {i + 1}", m.group(2), ROOT))
        for i, m in enumerate(_ONE_LINE.finditer(text)):
            out.append((f"{sh.relative_to(ROOT)} python3 -c {i + 1}", m.group(1), ROOT))
    return out


def imports(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) for every absolute import in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names if a.name != "*"]))
    return out


def unresolved(module: str, names: list[str], folder: Path) -> str | None:
    """Why `from module import names` would fail when run from `folder`; None if it works.
    A third-party package that is not installed here is not this project's to resolve."""
    top = module.split(".")[0]
    local = (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()
    if not local and top not in ("mt", "tests") and importlib.util.find_spec(top) is None:
        return None
    sys.path.insert(0, str(folder))
    try:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            return f"import {module}: {e}"
        missing = [n for n in names if not hasattr(mod, n) and not _submodule(module, n)]
        return f"from {module} import {', '.join(missing)}: no such name" if missing else None
    finally:
        sys.path.remove(str(folder))


def _submodule(module: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{module}.{name}") is not None
    except ImportError:
        return False


SOURCES = python_sources()


def test_the_sources_include_the_gpu_tests_and_the_shell_scripts_python():
    labels = [label for label, _, _ in SOURCES]
    assert "tests/test_cuda.py" in labels and "scripts/bench/gpu_figures.py" in labels
    assert any(label.startswith("scripts/gpu_check.sh heredoc") for label in labels)
    assert any(label.startswith("scripts/gpu_check.sh python3 -c") for label in labels)


@pytest.mark.parametrize("label,source,folder", SOURCES, ids=[s[0] for s in SOURCES])
def test_every_import_resolves(label, source, folder):
    bad = [f"line {line}: {why}" for line, module, names in imports(source)
           if (why := unresolved(module, names, folder))]  # fmt: skip
    assert not bad, f"{label}: " + "; ".join(bad)


def test_a_moved_module_and_a_renamed_name_are_found():
    source = (
        "def test():\n"
        "    from mt.decode.device_search import CHECK_EVERY\n"
        "    from mt.decode.search import beam_nbest, max_lengths\n"
    )
    found = [unresolved(m, n, ROOT) for _, m, n in imports(source)]
    assert found[0] is not None and "device_search" in found[0]
    assert found[1] is not None and "beam_nbest" in found[1] and "max_lengths" not in found[1]
