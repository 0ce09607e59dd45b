"""The tracefs mount for a command that cannot do without it (`list tracepoints`, `list
functions`, `cleanup`): when it is closed to this user, absent or cannot be mounted, one clear
sentence naming the command, and exit status 1 — no engine can stand in for the kernel here."""

from __future__ import annotations

import os

from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import EngineUnavailable


def tracefs_for(what: str) -> Tracefs:
    """The mounted tracefs, or EngineUnavailable saying that `what` (e.g. "listing
    tracepoints") needs it and why it cannot be had."""
    try:
        return Tracefs.discover()
    except EngineUnavailable as error:
        reason = error.message
        if reason.endswith(": not root"):
            reason = reason.removesuffix(": not root") + " to this user (not root)"
        raise EngineUnavailable(
            f"{what} needs the kernel's tracefs, and {reason}",
            hint=error.hint if os.geteuid() == 0 else "run it as root (e.g. with sudo)",
        ) from None
