"""The Engine protocol and the small values around it (what to trace, can it run, what it saw)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from probescope.events import Event, EventBatch
from probescope.language.resolved import ResolvedProbe


@dataclass(frozen=True)
class Availability:
    """Whether an engine can run here; `reason` says why not (and `hint` how to fix it)."""

    ok: bool
    reason: str = ""
    hint: str | None = None


@dataclass(frozen=True)
class Target:
    """Which processes to trace.

    `command`: start this argv with probes active and end with it; `pids`: existing processes
    (threads and children created later are followed); neither: system-wide (tracefs only).
    """

    command: tuple[str, ...] | None = None
    pids: tuple[int, ...] = ()
    follow_children: bool = True

    @property
    def system_wide(self) -> bool:
        return self.command is None and not self.pids


@dataclass
class EngineStats:
    """Counters an engine reports at the end (and on demand)."""

    hits: dict[str, int] = field(default_factory=dict)  # by "group/event"
    lost: int = 0
    misses: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)


class Engine(Protocol):
    name: str

    def available(self) -> Availability: ...

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None: ...

    def events(self) -> Iterator[Event | EventBatch]:
        """Events until detach() or the target's end. Yields at least every ~100 ms (an empty
        EventBatch when idle) so the consumer can stop on time."""
        ...

    def stats(self) -> EngineStats: ...

    def detach(self) -> None: ...
