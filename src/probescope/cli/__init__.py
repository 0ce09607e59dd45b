"""The `probescope` command: thin argument handling over the Python API.

`main` here is the entry point (console script and `python -m probescope`): it imports the
command's machinery inside its own guard, so a Ctrl-C that lands while Python is still
importing it ends with 130 like any other, not with a traceback."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from probescope.cli.main import main as run_command
    except KeyboardInterrupt:
        return 130
    return run_command(argv)
