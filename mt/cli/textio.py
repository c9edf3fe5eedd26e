"""Lines in and out of `mt translate`: a file or stdin, a file or stdout, and the interactive
mode at a terminal."""

from __future__ import annotations

import sys
from pathlib import Path

from mt.errors import MTError


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_input_output(
    input: Path | None, output: Path | None, force: bool, models: list[Path]
) -> None:
    """Before any work: the input exists, the output is writable and none of the inputs."""
    from mt.outputs import check_output, is_stdio

    check_output(output, force=force, inputs=[input, *models])
    if input is not None and not is_stdio(input) and input.is_dir():
        raise MTError(f"input {input} is a folder: give a text file (-i FILE) or none for stdin")
    if input is not None and not is_stdio(input) and not input.exists():
        raise MTError(f"input file {input} not found")


def read_input(path: Path | None) -> list[str]:
    from mt.data.corpus import decode_text, read_lines

    if path is None or str(path) == "-":
        return decode_text(sys.stdin.buffer.read(), "stdin")
    return read_lines(path)


def write_output(path: Path | None, lines: list[str]) -> None:
    from mt.outputs import is_stdio, write_text

    text = "".join(line + "\n" for line in lines)
    if path is None or is_stdio(path):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text(path, text)


def interactive(translator, opts, lang: str | None = None) -> None:
    """stdin is a terminal: answer each line as it is typed (Ctrl-D ends); lang: the target
    language whose token leads each line (a model of several pairs)."""
    from mt.data.pairs import tagged
    from mt.data.tokenizer import HeldToken

    _say("type a sentence and press Enter; Ctrl-D to quit")
    while True:
        if sys.stdout.isatty():
            try:
                line = input("> ")  # with line editing
            except EOFError:
                line = None
        else:  # stdout is a file: only translations go there
            sys.stderr.write("> ")
            sys.stderr.flush()
            line = sys.stdin.readline() or None
        if line is None:
            _say("")
            return
        try:
            print(translator.translate(tagged([line.rstrip("\n")], lang), opts)[0], flush=True)
        except HeldToken as e:  # a typed line: say so, and go on reading
            _say(f"error: this line {str(e).removeprefix('line 1 ')}")


def output_lines(translator, lines: list[str], opts, alignment: bool = False) -> list[str]:
    """The output lines of `mt translate`: translations, n-best rows (LINE TAB SCORE TAB
    TEXT) or translations with their alignment."""
    if alignment:
        return [
            "\t" if f is None else "\t".join(translator.alignment_of(f, opts))
            for f in translator.search(lines, opts, progress=True)
        ]
    if opts.nbest > 1:
        return [
            f"{i}\t{score:.4f}\t{text}"
            for i, hyps in enumerate(translator.translate_nbest(lines, opts.nbest, opts, True))
            for text, score in hyps
        ]
    return translator.translate(lines, opts, progress=True)
