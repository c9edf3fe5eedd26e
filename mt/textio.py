"""Lines in and out of `mt translate`: a file or stdin, a file or stdout, and the interactive
mode at a terminal."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from mt.errors import MTError


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_input(path: Optional[Path]) -> list[str]:
    from mt.data.corpus import read_lines
    if path is None or str(path) == "-":
        data = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MTError(f"stdin: invalid UTF-8 at byte {e.start}")
        return text.splitlines()
    return read_lines(path)


def write_output(path: Optional[Path], lines: list[str]) -> None:
    from mt.outputs import is_stdio, write_text
    text = "".join(line + "\n" for line in lines)
    if is_stdio(path):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text(path, text)


def format_nbest(nbest: list[list[tuple[str, float]]]) -> list[str]:
    """N lines per input line, best first: LINE (0-based) TAB SCORE TAB TRANSLATION."""
    return [f"{i}\t{score:.4f}\t{text}" for i, hyps in enumerate(nbest) for text, score in hyps]


def interactive(translator, options: dict) -> None:
    """stdin is a terminal: answer each line as it is typed (Ctrl-D ends)."""
    _say("type a sentence and press Enter; Ctrl-D to quit")
    while True:
        if sys.stdout.isatty():
            try:
                line = input("> ")          # with line editing
            except EOFError:
                line = None
        else:                               # stdout is a file: only translations go there
            sys.stderr.write("> ")
            sys.stderr.flush()
            line = sys.stdin.readline() or None
        if line is None:
            _say("")
            return
        print(translator.translate([line.rstrip("\n")], **options)[0], flush=True)
