"""The rich Console the commands print tables with, minus rich's own broken-pipe exit (status
1, stdout swapped for /dev/null whichever stream broke): the BrokenPipeError reaches `main`,
which ends every command the same way (status 141)."""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console


class _PipeConsole(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is rendered into the closed stream
        raise BrokenPipeError


def console(stream: IO[Any] | None = None, **options: Any) -> Console:
    """A Console writing to `stream` (stdout when None), `options` as rich takes them."""
    return _PipeConsole(file=stream, **options)
