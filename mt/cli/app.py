"""The `mt` Typer app, the command decorator (a user error, MTError, is one line on stderr
and exit status 2, never a traceback) and the checks several commands share."""

from __future__ import annotations

import functools

import typer

from mt.errors import MTError

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
            except OSError as e:
                if e.filename is None:
                    raise
                # a file mt reads or writes along the way (a log, a config, a BPE model)
                from mt.outputs import describe_os_error

                _err(f"error: {describe_os_error(e)}")
                raise typer.Exit(2) from None

        return app.command(name)(run)

    return wrap


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
            f"--beam {beam}: at most {MAX_BEAM} (BLEU stops improving after a beam of "
            f"about 10, and decoding time grows with the beam); use a smaller --beam"
        )


def _number_list(text: str, cast, flag: str) -> list:
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MTError(
            f"{flag} {text!r}: give comma-separated numbers, e.g. {flag} 1,5,10"
        ) from None
