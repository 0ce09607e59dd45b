"""The Engine protocol and the small values around it (what to trace, can it run, what it saw)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from probescope.engines.aggregation import KernelAggregation
from probescope.errors import EngineUnavailable
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
    # called with the command's pid while it is held before its exec (engines that start it
    # through a gate: tracefs, bpf), e.g. to seize it for its maps at exec and exit
    on_spawn: Callable[[int], None] | None = field(default=None, compare=False)

    @property
    def system_wide(self) -> bool:
        return self.command is None and not self.pids


def require_process_target(engine: str, target: Target, ready: Availability) -> None:
    """Refuse, before anything is touched, what an engine that traces processes cannot do: the
    whole system, or a machine where it cannot run (`ready`)."""
    if target.system_wide:
        raise EngineUnavailable(
            f"the {engine} engine traces processes, not the whole system",
            hint="give a command to run (-c) or process ids to attach to (-p)",
        )
    if not ready.ok:
        raise EngineUnavailable(ready.reason, hint=ready.hint)


@dataclass(frozen=True)
class EngineOptions:
    """What a session asks of its engine beyond probes and target.

    `clock`: the trace clock (`mono` = CLOCK_MONOTONIC); `buffer_size_kb`: ring buffer per CPU;
    `default_filter`: the filter of every tracepoint given without its own `if` (the bpf
    engine applies it to uprobes too, evaluated in the program);
    `allow_all_functions`: let a function-tracer pattern select every kernel function;
    `function_stack`: record the kernel stack with every function-tracer event; `user_stack`:
    record the user stack with every uprobe event (the kernel's `userstacktrace`: it then
    follows every event of the session); `kernel_stack`: record the kernel stack after every
    event (the kernel's `stacktrace`, for aggregations keyed by it); `read_interval`: how often
    the engine polls its buffers, in seconds (None: its own default); `aggregation`: aggregate
    in the kernel instead of streaming events (engines with `can_aggregate` only; see
    `engines.aggregation`). An engine whose
    mechanism has no such knob (a ring buffer size means nothing to ptrace) ignores it; one
    that cannot record what is asked (ptrace: user stacks) says so in `available()`.
    """

    clock: str = "mono"
    buffer_size_kb: int | None = None
    default_filter: str | None = None
    allow_all_functions: bool = False
    function_stack: bool = False
    user_stack: bool = False
    kernel_stack: bool = False
    read_interval: float | None = None
    aggregation: KernelAggregation | None = None


@dataclass
class EngineStats:
    """Counters an engine reports at the end (and on demand).

    `hits` are by "group/event" as the mechanism counts them; `hits_title` names them when they
    are not simply the events delivered (the kernel's uprobe_profile counts hits in every process:
    "kernel hits (all processes)"), and is None when they are. `command_status` is the exit code of
    the command the engine started, once it ended (negative: killed by that signal).
    `hits_after_stop` are events recorded after the session's stop (an engine with `stop()`
    that drains: recorded, by event, but not delivered).
    """

    hits: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    misses: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)
    hits_title: str | None = None
    command_status: int | None = None
    hits_after_stop: dict[str, int] = field(default_factory=dict)


class Engine(Protocol):
    """An engine is built as `factory(options=EngineOptions, kernel=RunningKernel)`."""

    name: str

    def available(self) -> Availability: ...

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None: ...

    def events(self) -> Iterator[Event | EventBatch]:
        """Events until detach() or the target's end. Yields at least every ~100 ms (an empty
        EventBatch when idle) so the consumer can stop on time."""
        ...

    def stats(self) -> EngineStats: ...

    def detach(self) -> None: ...


class Stoppable(Protocol):
    """An engine that can end a session gracefully: `stop()` ends recording now, and its
    events() then delivers what was recorded before and ends (the tracefs engine drains the
    kernel's ring buffer). Engines without it simply stop being read."""

    def stop(self) -> None: ...
