"""Whether the compiled report loop (`_fastformat.c`) is built and switched on, and the raw
per-CPU streams it reads: `PROBESCOPE_NO_ACCEL=1` turns it off, and everything it prints the
pure-Python path prints byte for byte (the tests run both)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType
from typing import NamedTuple

from probescope.traceevent.decoder import EventDecoder

DISABLE_VARIABLE = "PROBESCOPE_NO_ACCEL"
"""Set to a non-empty value other than `0` to print with pure Python only."""


class RawCpuStream(NamedTuple):
    """One CPU's recorded data: `chunks` of whole sub-buffers back to back, in time order, and
    the decoder that knows its layout and events."""

    cpu: int
    decoder: EventDecoder
    chunks: Iterator[bytes]


def accelerator() -> ModuleType | None:
    """The compiled module when it is built and not switched off, else None."""
    if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0"):
        return None
    try:
        from probescope.traceevent import _fastformat
    except ImportError:  # installed without a C compiler: the pure-Python path prints
        return None
    return _fastformat


def accelerated() -> bool:
    """Whether `probescope report`'s text output runs through the compiled loop."""
    return accelerator() is not None
