"""`--engine fentry` with a per-probe fallback: fentry for the probes it takes, another engine for
the rest, one event stream.

The session chooses engines for the whole set of probes; this wrapper is how fentry refuses
single probes without the session knowing. Before anything is touched, FentryEngine.refusals()
names each probe it will not take and why (not a function entry, memory-reading arguments,
a function that cannot be patched, ...). Those run on:
- the tracefs engine (the kernel's uprobes), when it can run here: it attaches to the same
  process first (for a command: to the child held before its exec, so no event is missed),
  with the same clock (CLOCK_MONOTONIC), and both streams are merged;
- otherwise (no root) the ptrace engine takes *every* probe: it must be the process's one
  resident tracer, so it cannot share a process with fentry's attach-patch-detach transactions.
Every fallback is listed in the stats' notes with the engine and the reason. A function
refused for one probe is refused for all its probes (catalog.py), so the kernel's breakpoint
and our jump never overlap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from probescope.engines.base import Availability, Engine, EngineOptions, EngineStats, Target
from probescope.engines.fentry import safety
from probescope.engines.fentry.engine import FentryEngine
from probescope.events import Event, EventBatch
from probescope.language.go_strings import KERNEL_CANNOT, kernel_inexpressible
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.system.kernel import RunningKernel


class FallbackEngine:
    """FentryEngine plus a second engine for the probes it refuses."""

    name = "fentry"

    def __init__(
        self,
        *,
        fallback: str = "auto",
        buffer_size_kb: int | None = None,
        options: EngineOptions | None = None,
        kernel: RunningKernel | None = None,
    ) -> None:
        self.fallback = fallback  # auto | tracefs | ptrace | none
        self.options = options or EngineOptions()
        self.kernel = kernel
        self.primary = FentryEngine(buffer_size_kb=buffer_size_kb, options=options)
        self.secondary: Engine | None = None
        self.taken_by: dict[ResolvedProbe, str] = {}
        self._notes: list[str] = []
        self._only_secondary = False

    @property
    def buffer_size_kb(self) -> int | None:
        return self.primary.buffer_size_kb

    @buffer_size_kb.setter
    def buffer_size_kb(self, value: int | None) -> None:
        self.primary.buffer_size_kb = value

    def available(self) -> Availability:
        return self.primary.available()

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None:
        pid = target.pids[0] if len(target.pids) == 1 else None
        state = self.primary.available()
        whole = None if state.ok else state.reason
        for each in target.pids:  # checked up front: seccomp, Go, musl, SELinux execmem
            problem = safety.process_problem(each)
            if whole is None and problem is not None:
                whole = f"process {each} {problem}"
        if whole is not None:
            refused = {probe: whole for probe in probes}
        else:
            refused = self.primary.refusals(probes, pid)
        taken = [p for p in probes if p not in refused]
        rest = [p for p in probes if p in refused]
        if not rest:
            self.primary.attach(taken, target)
            return
        if self.fallback == "none":
            self.primary.attach(probes, target)  # raises, listing every refusal
            return
        secondary_name = self._secondary_name(rest)
        for probe in rest:
            self.taken_by[probe] = secondary_name
            self._notes.append(
                f"{probe.label} runs on the {secondary_name} engine: {refused[probe]}"
            )
        secondary = self._create(secondary_name)
        self.secondary = secondary
        if secondary_name == "ptrace" or not taken:
            self._only_secondary = True
            if taken:
                self._notes.append(
                    f"the other {len(taken)} probes run on ptrace too: ptrace must be the "
                    "process's only tracer"
                )
            secondary.attach(probes, target)
            return
        if target.command is not None:
            self.primary.attach(
                taken,
                target,
                on_spawn=lambda child: secondary.attach(
                    rest, Target(pids=(child,), follow_children=target.follow_children)
                ),
            )
        else:
            secondary.attach(rest, target)
            try:
                self.primary.attach(taken, target)
            except BaseException:
                secondary.detach()
                raise

    def _secondary_name(self, rest: Sequence[ResolvedProbe]) -> str:
        from probescope.engines.registry import BY_NAME, availability

        if self.fallback in ("tracefs", "ptrace"):
            return self.fallback
        for probe in rest:  # a Go string: the kernel's uprobes cannot bound a read by a length
            unreadable = (
                kernel_inexpressible(probe.spec.args) if isinstance(probe.spec, ProbeSpec) else []
            )
            if unreadable:
                self._notes.append(
                    f"ptrace, not tracefs: {probe.label} fetches {unreadable[0].name}="
                    f"{unreadable[0].expression}, which {KERNEL_CANNOT}"
                )
                return "ptrace"
        if availability(BY_NAME["tracefs"], self.kernel).ok:
            return "tracefs"
        return "ptrace"

    def _create(self, name: str) -> Engine:
        from probescope.engines.registry import create_engine

        # the same clock as fentry's (CLOCK_MONOTONIC), so the two streams merge in time
        options = dataclasses.replace(self.options, clock="mono")
        return create_engine(name, options=options, kernel=self.kernel)

    def events(self) -> Iterator[Event | EventBatch]:
        secondary = self.secondary
        if secondary is None:
            yield from self.primary.events()
            return
        if self._only_secondary:
            yield from secondary.events()
            return
        yield from _merge(self.primary.events(), secondary.events())

    def stats(self) -> EngineStats:
        if self._only_secondary and self.secondary is not None:
            stats = self.secondary.stats()
            stats.notes = [*self._notes, *stats.notes]
            return stats
        stats = self.primary.stats()
        if self.secondary is not None:
            other = self.secondary.stats()
            for key, count in other.hits.items():
                stats.hits[key] = stats.hits.get(key, 0) + count
            stats.lost += other.lost
            stats.notes += other.notes
            stats.extra["fallback_probes"] = len(self.taken_by)
            if stats.command_status is None:
                stats.command_status = other.command_status
        stats.notes = [*self._notes, *stats.notes]
        return stats

    def detach(self) -> None:
        try:
            if not self._only_secondary:
                self.primary.detach()
        finally:
            if self.secondary is not None:
                self.secondary.detach()

    @property
    def exit_code(self) -> int | None:
        if self._only_secondary and self.secondary is not None:
            code: int | None = getattr(self.secondary, "exit_code", None)
            return code
        return self.primary.exit_code


def _merge(
    first: Iterator[Event | EventBatch], second: Iterator[Event | EventBatch]
) -> Iterator[EventBatch]:
    """Both streams, a batch from each in turn, until both end (each follows the target's
    life: the command's end, or the processes')."""
    streams = [first, second]
    done = [False, False]
    while not all(done):
        for index, stream in enumerate(streams):
            if done[index]:
                continue
            try:
                item = next(stream)
            except StopIteration:
                done[index] = True
                continue
            yield item if isinstance(item, EventBatch) else EventBatch([item])
