"""Events built by hand for aggregator unit tests."""

from __future__ import annotations

from typing import Any

from probescope.events import Event, EventType
from probescope.language.model import ArgType, ProbeKind

U64 = ArgType("x64", "x64", 8, False)
S32 = ArgType("s32", "s32", 4, True)


def event_type(
    name: str, args: tuple[str, ...] = (), kind: ProbeKind = ProbeKind.UPROBE
) -> EventType:
    return EventType("uprobes", name, kind, args, tuple(U64 for _ in args))


def event(
    kind: EventType, *args: Any, ts: int = 0, tid: int = 10, pid: int = 10, cpu: int = 0
) -> Event:
    return Event(ts, cpu, pid, tid, "prog", kind, 0x1000, None, tuple(args))
