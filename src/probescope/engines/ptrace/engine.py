"""PtraceEngine: the Engine protocol over the user-space uprobe tracer.

Threading rule: ptrace ties each tracee to the thread that attached it, so `attach()` and the
iteration of `events()` must happen on the same thread. `detach()` may be called from anywhere:
on that thread (including from a signal handler that interrupts the loop) it detaches at once;
from another thread it asks the loop, which looks at least every 100 ms, and waits for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from probescope.engines.base import (
    Availability,
    EngineOptions,
    EngineStats,
    Target,
    require_process_target,
)
from probescope.engines.exit_detach import detach_at_exit
from probescope.engines.ptrace import availability
from probescope.engines.ptrace.handlers import HitContext
from probescope.engines.ptrace.sites import build_sites
from probescope.engines.ptrace.tracee import ProbeSite, TracerOptions
from probescope.engines.ptrace.tracer import Tracer, exit_status_code
from probescope.engines.python_filter import probe_filters
from probescope.errors import PtraceError
from probescope.events import Event, EventBatch, EventType
from probescope.language.resolved import ResolvedProbe
from probescope.system.kernel import RunningKernel

Handler = Callable[[HitContext], None]
_CROSS_THREAD_DETACH_TIMEOUT = 10.0
_COMMAND_GRACE = 2.0


class PtraceEngine:
    """uprobes in user space: int3 + execute out of line + return trampolines, via ptrace.

    `pin_cpu`: True pins the tracer and its tracees to one CPU (a stop costs ~10x less when
    both sides share a CPU), an int picks that CPU, False leaves affinities alone.
    `emulate`: emulate relative branches/calls/nops at the stop (False runs every displaced
    instruction from its slot). `single_step`: execute displaced instructions the kernel's way,
    single-stepping a copy (two stops per hit; for comparison).
    """

    name = "ptrace"

    def __init__(
        self,
        *,
        pin_cpu: bool | int = True,
        emulate: bool = True,
        single_step: bool = False,
        options: EngineOptions | None = None,
        kernel: RunningKernel | None = None,
    ) -> None:
        # `options` (clock, ring buffer) have no knob here: the engine's clock is
        # CLOCK_MONOTONIC already and it has no ring buffer; `kernel` it does not need. User
        # stacks it cannot record: available() says so. Filters it evaluates in Python.
        self._user_stack = options is not None and options.user_stack
        self._default_filter = options.default_filter if options is not None else None
        self._keep: dict[EventType, Callable[[Event], bool]] = {}
        del options, kernel
        self._options = TracerOptions(pin_cpu=pin_cpu, emulate=emulate, single_step=single_step)
        self._handlers: dict[ResolvedProbe, list[Handler]] = {}
        self._sites: list[ProbeSite] = []
        self._tracer: Tracer | None = None
        self._owner: int | None = None
        self._events_started = False
        self._pids: list[int] = []
        self._command: int | None = None  # the pid of the command attach() started

    # -- options, also settable as attributes before attach ----------------------------------

    @property
    def pin_cpu(self) -> bool | int:
        return self._options.pin_cpu

    @pin_cpu.setter
    def pin_cpu(self, value: bool | int) -> None:
        self._set_option("pin_cpu", value)

    @property
    def emulate(self) -> bool:
        return self._options.emulate

    @emulate.setter
    def emulate(self, value: bool) -> None:
        self._set_option("emulate", value)

    @property
    def single_step(self) -> bool:
        return self._options.single_step

    @single_step.setter
    def single_step(self, value: bool) -> None:
        self._set_option("single_step", value)

    def _set_option(self, name: str, value: object) -> None:
        if self._tracer is not None:
            raise PtraceError(f"set {name} before attach()")
        setattr(self._options, name, value)

    # -- Engine protocol ---------------------------------------------------------------------

    def available(self) -> Availability:
        if self._user_stack:
            return Availability(
                False,
                "it records no user stacks (--stack)",
                "the tracefs engine records them (root: the kernel's userstacktrace)",
            )
        return availability.check()

    def on(self, probe: ResolvedProbe, handler: Handler) -> None:
        """Run `handler(ctx)` synchronously at every hit of `probe` (see HitContext)."""
        self._handlers.setdefault(probe, []).append(handler)
        for site in self._sites:
            if site.probe == probe and handler not in site.handlers:
                site.handlers.append(handler)

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None:
        if self._tracer is not None:
            raise PtraceError("this engine is already attached; use a new PtraceEngine")
        require_process_target("ptrace", target, self.available())
        filters = probe_filters(probes, self._default_filter)
        self._sites = build_sites(probes, self._handlers)
        for site in self._sites:
            if site.probe in filters:
                self._keep[site.event_type] = filters[site.probe][1]
        self._options.follow_children = target.follow_children
        tracer = Tracer(self._sites, self._options)
        self._tracer = tracer
        self._owner = threading.get_ident()
        detach_at_exit(self)
        # Ctrl-C, SIGTERM and SIGHUP wait until the probes are in (or attaching failed and
        # everything is undone): a half-done attach is never left behind.
        with _signals_held():
            try:
                if target.command is not None:
                    self._command = tracer.spawn(target.command)
                    self._pids.append(self._command)
                for pid in dict.fromkeys(target.pids):  # `-p X -p X` attaches once
                    tracer.attach(pid)
                    self._pids.append(pid)
            except BaseException:
                tracer.detach()
                raise

    def events(self) -> Iterator[Event | EventBatch]:
        tracer = self._require_tracer()
        if threading.get_ident() != self._owner:
            raise PtraceError(
                "events() must be iterated on the thread that called attach() "
                "(ptrace ties tracees to the attaching thread)"
            )
        if self._events_started:
            raise PtraceError("events() can be iterated only once per attach")
        self._events_started = True
        try:
            if not self._keep:
                yield from tracer.run()
                return
            keep = self._keep
            for item in tracer.run():  # the filters, evaluated as the kernel would
                if isinstance(item, EventBatch):
                    events = [e for e in item.events if e.type not in keep or keep[e.type](e)]
                    yield EventBatch(events, item.lost, item.cpu)
                elif item.type not in keep or keep[item.type](item):
                    yield item
        finally:
            self.detach()

    def stats(self) -> EngineStats:
        stats = EngineStats()
        tracer = self._tracer
        if tracer is None:
            return stats
        counters = tracer.counters
        stats.hits = dict(counters.by_event)
        stats.notes = list(counters.notes)
        stats.extra = {
            "stops": counters.stops,
            "hits": counters.hits,
            "internal_hits": counters.internal_hits,
            "emulated": counters.emulated,
            "slot_runs": counters.slot_runs,
            "single_steps": counters.single_steps,
            "hijacks": counters.hijacks,
            "trampolines": counters.trampolines,
            "depth_omitted": counters.depth_omitted,
            "breakpoints": counters.breakpoints,
            "xol_pages": counters.xol_pages,
            "injection_steps": tracer.injector.steps,
        }
        stats.command_status = self.exit_code
        if counters.depth_omitted:
            stats.notes.append(
                f"{counters.depth_omitted} return probes omitted: nesting deeper than 64"
            )
        return stats

    def detach(self) -> None:
        """Restore every byte and return address, unmap our pages, let every thread go; then
        end the command attach() started if it still runs (SIGTERM, SIGKILL after 2 s), as
        every engine does when a session ends first. Processes attached by pid run on.

        Idempotent; safe from a signal handler on the tracing thread and from other threads.
        Ctrl-C, SIGTERM and SIGHUP wait until it is done.
        """
        tracer = self._tracer
        if tracer is None:
            return
        if tracer.detached:
            self._end_command(tracer)
            return
        if threading.get_ident() == self._owner:
            with _signals_held():
                tracer.detach()
                self._end_command(tracer)
            return
        tracer.detach_requested = True  # the loop looks at least every TICK seconds
        deadline = time.monotonic() + _CROSS_THREAD_DETACH_TIMEOUT
        while not tracer.detached and time.monotonic() < deadline:
            time.sleep(0.005)
        if not tracer.detached:
            raise PtraceError(
                "detach did not complete: the thread that attached is not iterating events()",
                hint="call detach() on the thread that called attach()",
            )
        self._end_command(tracer)

    def _end_command(self, tracer: Tracer) -> None:
        pid, self._command = self._command, None
        if pid is None or tracer.root_status is not None:
            return
        status = _reaped(pid)
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + _COMMAND_GRACE
            while status is None and time.monotonic() < deadline:
                time.sleep(0.01)
                status = _reaped(pid)
            if status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                status = _reaped(pid, block=True)
            if status is not None:
                tracer.counters.notes.append(
                    f"the command (pid {pid}) was still running: terminated, status "
                    f"{exit_status_code(status)}"
                )
        tracer.root_status = status

    # -- extras ------------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """The processes this engine started or attached to."""
        return list(self._pids)

    @property
    def exit_code(self) -> int | None:
        """Exit code of the started command (negative: killed by that signal), once it ended."""
        tracer = self._tracer
        return None if tracer is None else exit_status_code(tracer.root_status)

    def _require_tracer(self) -> Tracer:
        if self._tracer is None:
            raise PtraceError("attach() first")
        return self._tracer


def _reaped(pid: int, *, block: bool = False) -> int | None:
    """The wait status of our child `pid` once it has ended (None while it runs)."""
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return None
    return status if done else None


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP in this thread while an attach or a detach runs: one
    that cut it short would leave threads stopped and bytes changed."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


__all__ = ["HitContext", "PtraceEngine"]
