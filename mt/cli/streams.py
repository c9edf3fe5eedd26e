"""Standard output whose failures say so: a write to a full disk or a closed pipe raises an
OSError that names "standard output", so the CLI reports it in one line (mt/cli/__init__.py)
instead of a traceback from wherever the text happened to be written or flushed."""

from __future__ import annotations

import codecs
import errno
import io
import os
import sys
from contextlib import suppress

STDOUT = "standard output"


class _NamedFd(io.RawIOBase):
    """Raw writes to a file descriptor that mt does not own (it is never closed here)."""

    def __init__(self, fd: int):
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data) -> int:
        try:
            return os.write(self._fd, data)
        except OSError as e:
            raise OSError(e.errno, e.strerror, STDOUT) from None  # EPIPE: BrokenPipeError


def utf8_streams() -> None:
    """Standard output and error in UTF-8 whatever the locale says (LC_ALL=C, or
    PYTHONIOENCODING=ascii): a translation, or a path in a message, holds any character, and
    an encoding that cannot write it would end the command in a traceback. (Input is read
    as bytes and decoded as UTF-8: mt.cli.textio.)"""
    codecs.register_error("mt.bytes_or_escape", _bytes_or_escape)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and codecs.lookup(stream.encoding).name != "utf-8":
            stream.reconfigure(encoding="utf-8", errors="mt.bytes_or_escape")


def _bytes_or_escape(error: UnicodeError) -> tuple[str | bytes, int]:
    """A path's bytes that the C locale could not decode (argv's surrogate escapes) written
    back as they were; anything else unencodable written as a backslash escape, never an
    error."""
    try:
        return codecs.lookup_error("surrogateescape")(error)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(error)


def name_stdout() -> None:
    """Replace sys.stdout (the process's own fd 1) by the same stream over _NamedFd."""
    out = sys.stdout
    try:
        if not isinstance(out, io.TextIOWrapper) or out.fileno() != 1:
            return  # a test's capture, or already replaced
    except (OSError, ValueError):
        return
    out.flush()
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_NamedFd(1)),
        encoding=out.encoding,
        errors=out.errors,
        line_buffering=out.line_buffering,
    )


def silence_stdout() -> None:
    """Point fd 1 at /dev/null and drop what is buffered, so that the interpreter's last flush
    of the text that could not be written does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    with suppress(OSError):
        sys.stdout.flush()


def stdout_failed(e: OSError) -> int | None:
    """For an OSError about standard output: its one line said (none for a reader that stopped
    reading, `mt translate ... | head`, which ends quietly as SIGPIPE would), standard output
    silenced, and the exit status; None for any other error."""
    if e.filename != STDOUT:
        return None
    silence_stdout()
    if e.errno == errno.EPIPE:
        return 128 + 13
    print(
        f"error: {STDOUT}: {e.strerror}; free space where it goes, or write elsewhere",
        file=sys.stderr,
    )
    return 2
