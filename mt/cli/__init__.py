"""The `mt` command line. Commands parse flags and delegate to the library (no logic here);
a user error is one line on stderr and exit status 2, never a traceback.

    app.py      the Typer app, the error handling, shared flag checks
    run.py      download, configs, train
    use.py      translate, eval, attention, export
    score.py    score
    tools.py    report, average, tune, plot
    serve.py    serve (the HTTP server of mt/serve/)
    streams.py  standard output whose failures name it
"""

from __future__ import annotations

import sys

from mt.cli import (
    run,  # noqa: F401  (each module registers its commands, in this order)
    score,  # noqa: F401
    serve,  # noqa: F401
    tools,  # noqa: F401
    use,  # noqa: F401
)
from mt.cli.app import INTERRUPTED, _err, app
from mt.cli.streams import name_stdout, stdout_failed, utf8_streams


def main() -> None:
    from mt.errors import Interrupted

    utf8_streams()
    name_stdout()
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # here, where a failure is caught, not at the interpreter's exit
    except Interrupted as e:
        _err(f"\n{e}")
        sys.exit(130)
    except KeyboardInterrupt:
        _err(f"\n{INTERRUPTED}")
        sys.exit(130)
    except OSError as e:  # standard output failing at the last flush
        status = stdout_failed(e)
        if status is None:
            raise
        sys.exit(status)
