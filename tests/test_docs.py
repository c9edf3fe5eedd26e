"""The documentation: its generated references cover every config key and every command, the
site builds in strict mode and renders offline, and the repository's prose speaks of the
product only."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mt.config import Config, ScheduledSamplingConfig
from mt.config.data import CorpusConfig

ROOT = Path(__file__).resolve().parent.parent


def _reference_module():
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts/docs_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _rows(page: str) -> dict[str, list[str]]:
    """The page's table rows whose first cell is a `key`, as {key: cells}."""
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and re.fullmatch(r"`[^`]+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_config_reference_lists_every_key_with_its_default():
    # every key a config can hold, from the config's own defaults (scheduled sampling is unset
    # by default, so its keys come from its section's defaults)
    keys = _flatten(Config().model_dump(mode="json"))
    keys.update(
        _flatten(ScheduledSamplingConfig().model_dump(mode="json"), "train.scheduled_sampling.")
    )
    keys.pop("train.scheduled_sampling")
    # (data.corpora is a list of sections; a corpus's name has no default: required)
    keys.update(_flatten(CorpusConfig(name="x").model_dump(mode="json"), "data.corpora."))
    keys.pop("data.corpora")
    rows = _rows(_reference_module().config_reference())
    assert rows.pop("data.corpora.name")[2] == "required"
    keys.pop("data.corpora.name")

    assert set(rows) == set(keys), (set(keys) - set(rows), set(rows) - set(keys))
    for key, default in keys.items():
        cells = rows[key]
        shown = cells[2].strip("`")
        assert (None if shown == "unset" else yaml.safe_load(shown)) == default, key
        assert cells[4], f"{key} has no description"
    # the allowed values of a choice are the schema's
    assert "`post`, `pre`" in rows["model.norm"][3]
    assert "≥ 1" in rows["train.max_steps"][3]


def test_the_command_reference_has_every_command_and_flag():
    page = _reference_module().command_reference()
    listed = subprocess.run(
        [sys.executable, "-m", "mt", "--help"], capture_output=True, text=True, check=True
    ).stdout
    names = re.findall(r"^  (\w+)\s", listed.split("Commands:")[1], flags=re.M)
    assert len(names) >= 13
    for name in names:
        assert f"## `mt {name}`" in page, name
        helptext = subprocess.run(
            [sys.executable, "-m", "mt", name, "--help"], capture_output=True, text=True, check=True
        ).stdout
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", helptext):
            assert flag in page, f"mt {name} {flag}"
    for status in ("| 0 |", "| 2 |", "| 130 |", "| 141 |", "| 143 |"):
        assert status in page


def test_the_environment_reference_has_every_variable_mt_reads():
    page = _reference_module().environment_reference()
    read = set()
    for path in (ROOT / "mt").rglob("*.py"):
        read |= set(re.findall(r'env_int\("(\w+)"\)', path.read_text()))
    assert read >= {"MT_THREADS", "WORLD_SIZE", "RANK"}
    for name in read:
        assert f"`{name}`" in page


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed")
def test_the_site_builds_strictly_and_needs_no_network(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages = list(site.rglob("*.html"))
    assert (site / "reference/config/index.html").is_file()
    assert "train.max_steps" in (site / "reference/config/index.html").read_text()
    assert "translate_nbest" in (site / "reference/api/index.html").read_text()
    fetched = re.compile(
        r"""<(?:script|img|iframe)[^>]*\bsrc=["']https?://|<link[^>]*\bhref=["']https?://[^"']*"""
        r"""\.(?:css|woff2?|js)|@import\s+url\(["']?https?://|fonts\.googleapis"""
    )
    for page in pages:
        hits = fetched.findall(page.read_text())
        assert not hits, f"{page.relative_to(site)} fetches {hits[:3]}"


# Words that speak of how the project was developed rather than of the product; the two
# technical uses of one of them are allowed by _ALLOWED: pytest's fixture scope and the
# WebDriver endpoint that starts a browser (tests/webdriver.py).
_PROCESS = re.compile(
    r"\b("
    + "|".join(["sess" + "ions?", "lea" + "ses?", "le" + "nt", "go" + "al", "iss" + r"ue \d+"])
    + r")\b",
    re.IGNORECASE,
)
_WORD = "sess" + "ion"  # spelt in pieces, as in _PROCESS, so this file passes its own test
_ALLOWED = re.compile(f'scope="{_WORD}"|NEW_BROWSER = "/{_WORD}"|W3C "New {_WORD.title()}"')


def test_the_repository_speaks_of_the_product_only():
    paths = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml"]
    for folder in ("docs", "mt", "tests", "scripts", "mt/configs"):
        paths += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.suffix in {".md", ".py", ".sh", ".yaml", ".yml"}
        ]
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _PROCESS.search(line) and not _ALLOWED.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_generated_reference_pages_are_committed():
    # docs/ reads as Markdown without mkdocs; the next test keeps them the code's
    tracked = subprocess.run(
        ["git", "ls-files", "docs/reference"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert {f"docs/{p}" for p in _reference_module().PAGES} <= set(tracked)


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 400
    first_screen = "\n".join(lines[:25])
    assert "Start here" in first_screen and "mt train tiny" in first_screen
    # every docs page the README names exists
    for target in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines)):
        assert (ROOT / target).is_file(), target


def test_the_committed_reference_pages_are_the_code_s_and_every_link_in_docs_resolves():
    """docs/reference/ holds the generated pages (docs/ reads as Markdown without mkdocs):
    each equals what the code generates now, and every relative link of the README and docs/
    names a file that exists."""
    for path, text in _reference_module().pages().items():
        committed = ROOT / "docs" / path
        assert committed.is_file() and committed.read_text(encoding="utf-8") == text, (
            f"{path} is stale: run python scripts/docs_reference.py docs"
        )
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} -> {target}"
