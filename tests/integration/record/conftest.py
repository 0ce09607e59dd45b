"""Recordings are made by the tracefs engine's sessions: its test targets and its check that
nothing is left in tracefs serve here too."""

from __future__ import annotations

from integration.tracefs_engine.conftest import (
    forks,
    loop,
    nothing_left_behind,
    target,
    threads,
    ticker,
)

__all__ = ["forks", "loop", "nothing_left_behind", "target", "threads", "ticker"]
