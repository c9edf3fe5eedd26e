"""The `mt` command line. Commands parse flags and delegate to the library (no logic here);
a user error is one line on stderr and exit status 2, never a traceback.

    app.py    the Typer app, the error handling, shared flag checks
    run.py    download, configs, train
    use.py    translate, eval, attention, export
    tools.py  report, average, tune, plot
"""

from __future__ import annotations

import sys

from mt.cli import (
    run,  # noqa: F401  (each module registers its commands, in this order)
    tools,  # noqa: F401
    use,  # noqa: F401
)
from mt.cli.app import _err, app


def main() -> None:
    from mt.errors import Interrupted

    try:
        app()
    except Interrupted as e:
        _err(f"\n{e}")
        sys.exit(130)
    except KeyboardInterrupt:
        _err("\ninterrupted")
        sys.exit(130)
