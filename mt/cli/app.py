"""The `mt` Typer app, the command decorator (a user error, MTError, is one line on stderr
and exit status 2, never a traceback) and the checks several commands share."""

from __future__ import annotations

import functools
import re

import typer
from typer.core import TyperArgument, TyperCommand

from mt.cli.streams import stdout_failed
from mt.errors import Interrupted, MTError, shorten

# The statuses mt exits with (the command reference lists them from here).
EXIT_STATUSES = {
    0: "done (mt train: its step or time budget was spent, or it stopped early)",
    2: "a problem to fix, said in one line: a config, corpus, checkpoint, flag, output path, "
    "environment variable, or a full disk",
    130: "stopped by Ctrl-C (SIGINT, 128 + 2); a training saved last.pt first and the same "
    "command resumes it",
    141: "standard output was closed by its reader (mt translate ... | head)",
    143: "stopped by SIGTERM (128 + 15), as a job scheduler sends before preemption; a training "
    "saved last.pt first",
}

INTERRUPTED = "interrupted: stopped before the end; no output file was written half-way"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain one-line usage errors, no boxes
    help="Train, run and score Transformer translation models.",
)


def _print_version(value: bool) -> None:
    if value:
        import mt

        typer.echo(f"mt {mt.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print the version and exit",
    ),
):
    """Train, run and score Transformer translation models."""


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def command(name: str):
    """Register a command whose MTError becomes one line on stderr and exit status 2."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            from mt.runtime.env import check_environment

            try:
                check_environment()
                return fn(*args, **kwargs)
            except MTError as e:
                _err(f"error: {e}")
                raise typer.Exit(2) from None
            except KeyboardInterrupt as e:  # Ctrl-C outside a training's own handling
                _err(f"\n{e}" if isinstance(e, Interrupted) else f"\n{INTERRUPTED}")
                raise typer.Exit(130) from None
            except OSError as e:
                if e.filename is None:
                    raise
                status = stdout_failed(e)
                if status is not None:
                    raise typer.Exit(status) from None
                # a file mt reads or writes along the way (a log, a config, a BPE model)
                from mt.outputs import describe_os_error

                _err(f"error: {describe_os_error(e)}")
                raise typer.Exit(2) from None

        _plain_metavars(fn)
        return app.command(name, cls=_PlainCommand)(run)

    return wrap


class _PlainCommand(TyperCommand):
    """--help's usage line and argument list name each argument as usage lines do
    (`mt translate [OPTIONS] MODEL...`), without Typer's braces and type labels; a command
    with --set takes its overrides in command-line order (sets_in_order)."""

    def parse_args(self, ctx, args):
        if any(p.name == "overrides" for p in self.params):
            args = sets_in_order(args)
        return super().parse_args(ctx, args)

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:
            if isinstance(p, TyperArgument) and p.metavar:
                word = p.metavar + ("..." if p.nargs != 1 else "")
                usage = word if p.required else f"[{word}]"
                p.display_type_rich = lambda ctx: None
                p._rich_display_name = lambda word=word: word
                p._usage_display_name = lambda usage=usage: usage
        return params


def _plain_metavars(fn) -> None:
    """--help shows each value as a plain word (FILE, N, X, TEXT; an argument by its name)
    rather than Typer's type labels (<path>, <int range>, <list[Path]>)."""
    import inspect
    import typing
    from pathlib import Path

    from typer.models import ArgumentInfo, OptionInfo

    hints = typing.get_type_hints(fn, include_extras=True)
    for name, param in inspect.signature(fn).parameters.items():
        kind = hints.get(name)
        info = param.default
        if typing.get_origin(kind) is typing.Annotated:  # (the flag declared in its type)
            kind, *extras = typing.get_args(kind)
            info = next((x for x in extras if isinstance(x, ArgumentInfo | OptionInfo)), info)
        if not isinstance(info, ArgumentInfo | OptionInfo) or info.metavar is not None:
            continue
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        many = typing.get_origin(kind) is list or any(typing.get_origin(a) is list for a in args)
        while args:  # Optional[...] and list[...] down to the element's type
            kind, args = args[0], [a for a in typing.get_args(args[0]) if a is not type(None)]
        if kind is bool:
            continue
        if kind is Path and getattr(info, "parser", None) is None:
            info.parser = _user_path
        if kind is float and getattr(info, "parser", None) is None:
            info.parser = _finite
        if isinstance(info, ArgumentInfo):
            info.metavar = name.upper().removesuffix("S") if many else name.upper()
        else:
            words: dict[object, str] = {Path: "PATH", int: "N", float: "X"}
            info.metavar = words.get(kind, "TEXT")


def exit_if_stopped_by(signum: int) -> None:
    """A training stopped by a signal has saved last.pt and exits 128 + the signal's number
    (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a program the signal ended: a script
    or job scheduler sees that the run did not finish and does not go on to use it."""
    if signum:
        raise typer.Exit(128 + signum)


def _check_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda"):
        raise MTError(f"--device {device!r}: use auto, cpu or cuda")


def _check_beam(beam: int | None) -> None:
    from mt.config import MAX_BEAM

    if beam is not None and beam > MAX_BEAM:
        raise MTError(
            f"--beam {shorten(str(beam))}: at most {MAX_BEAM} (BLEU stops improving after a "
            f"beam of about 10, and decoding time grows with the beam); use a smaller --beam"
        )


def _number_list(text: str, cast, flag: str) -> list:
    """Comma-separated numbers; none at all (--beams "") is refused, never read as the
    default."""
    try:
        values = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise MTError(
            f"{flag} {shorten(repr(text))}: give comma-separated numbers, e.g. {flag} 1,5,10"
        )
    return values


def _user_path(value: str):
    """Every path flag and argument: `~` expanded (the shell leaves it alone after `=`, as in
    --run-dir=~/runs/a), an empty one refused (what an unset "$RUN" gives), and so is a folder
    named `~` (mt.config.section.user_path)."""
    from pathlib import Path

    import typer

    from mt.config.section import user_path

    try:
        return Path(user_path(value))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _finite(value: str) -> float:
    """Every number flag: a finite number (nan, inf and 1e309 are refused here; each flag's
    own range is checked where it is used)."""
    import math

    import typer

    try:
        number = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise typer.BadParameter(f"{value!r}: must be a finite number")
    return number


# a KEY=VALUE override: a dotted key, then =
_OVERRIDE = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*=")


def sets_in_order(args: list[str]) -> list[str]:
    """`--set A B --set C`: click would give --set's values [A, C] and the arguments after
    them [B], and the later of two settings of a key would not always win. Each KEY=VALUE
    that follows a --set's value is made a --set of its own, so that the overrides keep the
    command line's order."""
    out: list[str] = []
    following = False  # whether the last tokens were a --set and its values
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        if following and not arg.startswith("-") and _OVERRIDE.match(arg):
            out += ["--set", arg]
            continue
        following = arg.startswith("--set=") or (i > 0 and args[i - 1] == "--set")
        out.append(arg)
    return out
