"""FentryEngine: the Engine protocol over trap-free function probes (mechanisms.md §10).

`attach()` sets the target up (tracer.py) and starts the service thread; `events()` drains the
rings into Events every few milliseconds; `detach()` restores every process. Probes the engine
cannot take are listed by `refusals()` before anything is touched; `attach()` refuses them with
their reasons (FallbackEngine runs them through another engine instead).
"""

from __future__ import annotations

import operator
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from probescope.engines.base import (
    Availability,
    EngineOptions,
    EngineStats,
    Target,
    require_process_target,
)
from probescope.engines.exit_detach import detach_at_exit
from probescope.engines.fentry import safety
from probescope.engines.fentry.catalog import Catalog, build_catalog, function_event_type
from probescope.engines.fentry.clock import TscClock, tsc_problem
from probescope.engines.fentry.decode import Comms, Decoder
from probescope.engines.fentry.functions import UserCallText
from probescope.engines.fentry.ring import RECORD_SIZE, ring_bytes
from probescope.engines.fentry.tracer import FentryTracer, TracerOptions
from probescope.engines.ptrace import availability as ptrace_availability
from probescope.engines.ptrace.tracer import exit_status_code
from probescope.engines.python_filter import probe_filters
from probescope.errors import EngineUnavailable, PtraceError
from probescope.events import Event, EventBatch, EventType
from probescope.language.resolved import ResolvedProbe
from probescope.system.kernel import RunningKernel

POLL_SECONDS = 0.005
IDLE_TICK = 0.1
_BATCH = 65536
DEFAULT_BUFFER_KB = 16 * 1024


class FentryEngine:
    """Function entries and returns patched into jumps to stubs that record into a shared ring.

    `buffer_size_kb`: the ring's size (16 MiB: 131,072 records of 128 bytes); a full ring
    counts the records it drops. `follow_children`: keep recording fork children (they share
    the ring) and set up exec'd images; False restores children as soon as they are noticed.
    """

    name = "fentry"

    def __init__(
        self,
        *,
        buffer_size_kb: int | None = None,
        options: EngineOptions | None = None,
        kernel: RunningKernel | None = None,
    ) -> None:
        # of the session's options only the buffer size means something here (the ring); the
        # clock is CLOCK_MONOTONIC already, and the running kernel is not consulted
        del kernel
        self.buffer_size_kb = buffer_size_kb or (options.buffer_size_kb if options else None)
        # filters (`... if EXPR`, --filter) are evaluated in Python on the decoded events
        self._default_filter = options.default_filter if options else None
        # stack records after events (--stack) are the kernel's (user)stacktrace: none here
        self._stacks = options is not None and (options.user_stack or options.kernel_stack)
        self._keep: dict[EventType, Callable[[Event], bool]] = {}
        self._tracer: FentryTracer | None = None
        self._catalog: Catalog | None = None
        self._clock: TscClock | None = None
        self._hits: dict[str, int] = {}
        self._lost = 0
        self._events_started = False
        self._pids: list[int] = []
        self._comms = Comms()
        self._calls = UserCallText()

    # -- Engine protocol ---------------------------------------------------------------------

    def available(self) -> Availability:
        if self._stacks:
            return Availability(
                False,
                "it records no user stacks (--stack)",
                "the tracefs engine records them (root: the kernel's userstacktrace)",
            )
        if platform.machine() != "x86_64":
            return Availability(
                False, f"the fentry engine is x86_64 only, not {platform.machine()}"
            )
        problem = tsc_problem()
        if problem is not None:
            return Availability(False, problem, hint="use --engine ptrace or tracefs")
        problem = safety.selinux_problem()
        if problem is not None:
            return Availability(False, problem, hint="use --engine tracefs")
        state = ptrace_availability.check()
        if not state.ok:
            return Availability(False, state.reason, hint=state.hint)
        return Availability(True, state.reason)

    def refusals(
        self, probes: Sequence[ResolvedProbe], pid: int | None = None
    ) -> dict[ResolvedProbe, str]:
        """The probes this engine will not take, each with the reason (nothing is touched)."""
        return dict(self._plan(probes, pid).refusals)

    def _plan(self, probes: Sequence[ResolvedProbe], pid: int | None) -> Catalog:
        return build_catalog(probes, pid=pid, call_type=function_event_type(self._calls))

    def attach(
        self,
        probes: Sequence[ResolvedProbe],
        target: Target,
        *,
        on_spawn: Callable[[int], None] | None = None,
    ) -> None:
        """Set the target up. `on_spawn(pid)` runs while a command's child is held before its
        exec (another engine can attach to it there without missing an event)."""
        if self._tracer is not None:
            raise PtraceError("this engine is already attached; use a new FentryEngine")
        require_process_target("fentry", target, self.available())
        catalog = self._plan(probes, target.pids[0] if len(target.pids) == 1 else None)
        if catalog.refusals:
            lines = [f"{probe.label}: {reason}" for probe, reason in catalog.refusals.items()]
            raise EngineUnavailable(
                f"the fentry engine cannot take {len(lines)} probes:\n  " + "\n  ".join(lines),
                hint="--engine auto runs these through another engine",
            )
        if not catalog.site_count:
            raise EngineUnavailable("no probes for the fentry engine")
        filters = probe_filters(probes, self._default_filter)
        for by_offset in catalog.groups.values():
            for group in by_offset.values():
                for use in group.entries + group.returns:
                    if use.probe in filters:
                        self._keep[use.event_type] = filters[use.probe][1]
        self._catalog = catalog
        self._clock = TscClock()
        kb = self.buffer_size_kb or DEFAULT_BUFFER_KB
        records = 1 << max(10, (kb * 1024 // RECORD_SIZE).bit_length() - 1)
        tracer = FentryTracer(
            catalog, TracerOptions(ring_records=records, follow_children=target.follow_children)
        )
        tracer.on_installed += [self._comms.remember_process, self._calls.remember]
        tracer.notes.extend(catalog.notes)
        tracer.notes.extend(safety.machine_notes())
        self._tracer = tracer
        detach_at_exit(self)
        try:
            if target.command is not None:
                self._pids.append(tracer.spawn(target.command, on_spawn))
            for pid in target.pids:
                tracer.attach(pid)
                self._pids.append(pid)
        except BaseException:
            tracer.detach()
            self._close_rings()
            raise
        tracer.start()

    def events(self) -> Iterator[Event | EventBatch]:
        tracer = self._require_tracer()
        if self._events_started:
            raise PtraceError("events() can be iterated only once per attach")
        self._events_started = True
        clock = self._clock
        assert clock is not None
        decoder = Decoder(self._comms)
        hits = self._hits
        known: set[int] = set(self._pids)
        last_yield = time.monotonic()
        last_refresh = 0.0
        try:
            while True:
                finished = tracer.finished.is_set()
                now = time.monotonic()
                if now - last_refresh > 0.05:
                    clock.refresh()
                    last_refresh = now
                line = clock.line()
                events: list[Event] = []
                lost = 0
                with tracer.lock:
                    families = list(tracer.families)
                for family in families:
                    records, dropped = family.ring.read(_BATCH, decoder.layout(family))
                    lost += dropped
                    if records:
                        events += decoder.decode(
                            family, records, line, tracer.saw_pid, known, tracer.unfollowed
                        )
                if events and self._keep:
                    keep = self._keep
                    events = [e for e in events if e.type not in keep or keep[e.type](e)]
                if events or lost:
                    events.sort(key=_timestamp)
                    for event_type, count in Counter(map(_type, events)).items():
                        key = f"{event_type.group}/{event_type.name}"
                        hits[key] = hits.get(key, 0) + count
                    self._lost += lost
                    last_yield = now
                    yield EventBatch(events, lost)
                    continue
                if finished and not any(f.ring.pending() for f in families):
                    break
                if now - last_yield >= IDLE_TICK:
                    last_yield = now
                    yield EventBatch([])
                time.sleep(POLL_SECONDS)
            if tracer.error is not None:
                raise tracer.error
        finally:
            self.detach()

    def stats(self) -> EngineStats:
        stats = EngineStats()
        tracer = self._tracer
        if tracer is None:
            return stats
        stats.hits = dict(self._hits)
        stats.lost = self._lost
        stats.notes = list(tracer.notes)
        counters = tracer.counters
        with tracer.lock:
            families = list(tracer.families)
            images = list(tracer.images.values())
        omitted = sum(f.ring.omitted for f in families if not f.ring.closed)
        patched = tracer.installer.patched
        stats.extra = {
            "nop_sites": patched["nop"],
            "detour_sites": patched["detour"],
            "hook_sites": patched["hook"],
            "areas": sum(len(i.areas) for i in images),
            "rings": len(families),
            "transactions": counters.transactions,
            "dlopen_handshakes": counters.dlopen_handshakes,
            "exec_handshakes": counters.exec_handshakes,
            "late_execs": counters.late_execs,
            "forks": counters.forks,
            "retries": counters.retries,
            "restored_sites": counters.restored_sites,
            "restored_returns": counters.restored_returns,
            "depth_omitted": omitted,
            "lost_stuck": sum(f.ring.lost_stuck for f in families),
        }
        stats.command_status = self.exit_code
        if omitted:
            stats.notes.append(f"{omitted} return probes omitted: nesting deeper than 64")
        return stats

    def detach(self) -> None:
        """Restore every process (original bytes, real return addresses), unmap our areas where
        nothing refers to them, stop serving. Idempotent."""
        tracer = self._tracer
        if tracer is None or (tracer.detached and tracer.finished.is_set()):
            return
        tracer.detach()
        if not self._events_started:
            self._close_rings()

    # -- extras ------------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    @property
    def exit_code(self) -> int | None:
        tracer = self._tracer
        return None if tracer is None else exit_status_code(tracer.root_status)

    def _close_rings(self) -> None:
        tracer = self._tracer
        if tracer is None:
            return
        with tracer.lock:
            for family in tracer.families:
                family.ring.close()

    def _require_tracer(self) -> FentryTracer:
        if self._tracer is None:
            raise PtraceError("attach() first")
        return self._tracer


_timestamp = operator.itemgetter(0)
_type = operator.attrgetter("type")


def ring_size_kb(records: int) -> int:
    return ring_bytes(records) // 1024
