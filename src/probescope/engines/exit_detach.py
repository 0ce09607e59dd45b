"""Engines that patch a live process detach at interpreter exit, whatever ended the program
that used them without closing its session (a script that returns, `sys.exit`)."""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class _Detachable(Protocol):
    def detach(self) -> None: ...


_live: weakref.WeakSet[_Detachable] = weakref.WeakSet()
_registered = False


def detach_at_exit(engine: _Detachable) -> None:
    """Call `engine.detach()` at interpreter exit unless the engine is gone by then."""
    global _registered
    _live.add(engine)
    if not _registered:
        atexit.register(_detach_all)
        _registered = True


def _detach_all() -> None:
    for engine in list(_live):
        try:
            engine.detach()
        except Exception:  # best effort at interpreter exit
            pass
