"""The tracefs engine: the kernel's own uprobes (and kprobes, tracepoints, the function
tracer), recorded in a private instance and read back from the binary ring buffer.

attach: reap leftovers of dead sessions → start the watchdog (`watchdog`: it removes what
this session creates if the session dies without teardown) → create instance
`probescope-<pid>-<start>-<n>` → define every probe in group `probescope_<pid>_<start>_<n>`
(one batched write, `session_events`) → read the formats and build the decoder
(`event_formats`) → filter pids (set_event_pid + event-fork) → set the uprobes' filters →
start the recorder (`spool`) → keep the session's own processes out of the trace
(set_event_notrace_pid) → tracing on → enable the group, the tracepoints and the function
tracer (`function_tracer`) in the instance only (so every hit the kernel counts is recorded).

Streaming decodes sub-buffers (`traceevent`), names tasks (`task_names`) and merges CPUs in
time order, waiting on the kernel (the recorder polls `trace_pipe_raw`, the session the
recorder's pipe and the traced processes' pidfds): nothing is read on a timer.

stop (`-d`, `-n`, Ctrl-C): the probes disabled and tracing off, then what the ring buffer
holds is drained (events after the stop's moment counted, not shown).

detach: close readers → read the kernel's counters (`profiles`) and the loss counters → rmdir
the instance (which disables its events) → remove the group's definitions → sweep anything
else named after the session → stand the watchdog down. Every step of detach runs even if an
earlier one failed.
"""

from __future__ import annotations

import contextlib
import operator
import os
import select
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from probescope.engines.base import Availability, EngineOptions, EngineStats, Target
from probescope.engines.launch import GatedCommand
from probescope.engines.python_filter import probe_filters
from probescope.engines.tracefs.dynamic_events import DynamicEvents, EventName
from probescope.engines.tracefs.event_formats import session_decoder
from probescope.engines.tracefs.function_tracer import start_function_tracer
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.instance_files import InstanceFiles, read_instance_files
from probescope.engines.tracefs.ownership import Owner
from probescope.engines.tracefs.profiles import read_profiles
from probescope.engines.tracefs.reaper import find_leftovers, leftovers_named, reap
from probescope.engines.tracefs.session_events import (
    enable_group,
    enable_tracepoints,
    event_filters,
    install,
    kernel_refusal,
    session_specs,
    set_event_filters,
)
from probescope.engines.tracefs.spool import PageSpool, idle_wait_for
from probescope.engines.tracefs.static_plan import check_functions, plan_tracepoints
from probescope.engines.tracefs.task_names import TaskNames
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.engines.tracefs.watchdog import Watchdog
from probescope.errors import EngineUnavailable, ProbescopeError, TracefsError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import FunctionSpec, TracepointSpec
from probescope.system.kernel import RunningKernel
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.format import EventFormat
from probescope.traceevent.merge import LiveMerge
from probescope.traceevent.ringbuffer import SubBufferLayout, read_header

FINAL_DRAIN_SECONDS = 2.0


@dataclass
class _Installed:
    """What attach created, so detach knows exactly what to undo; `instance_name` and `group`
    are set before anything is created, so that what a signal interrupted half-way is found
    by name too."""

    instance: Instance | None = None
    events: dict[str, list[EventName]] = field(default_factory=dict)
    instance_name: str | None = None
    group: str | None = None


class TracefsEngine:
    """The kernel's own probes, tracepoints and function tracer in a private instance; see the
    module's docstring for attach and detach."""

    name = "tracefs"

    def __init__(
        self,
        tracefs: Tracefs | None = None,
        *,
        options: EngineOptions | None = None,
        kernel: RunningKernel | None = None,
        interval: float = 0.1,
    ) -> None:
        self.options = options or EngineOptions()
        self.kernel = kernel or RunningKernel.read()
        self.interval = self.options.read_interval or interval
        self._tracefs = tracefs
        self._installed = _Installed()
        self._types: dict[str, EventType] = {}
        self._reader: PageSpool | None = None
        self._decoder: EventDecoder | None = None
        self._command: GatedCommand | None = None
        self._pids: tuple[int, ...] = ()
        self._tasks: TaskNames | None = None
        self._stats = EngineStats(hits_title="kernel hits (all processes)")
        self._page_lost = 0
        self._ring_lost = 0
        self._detached = False
        self._watchdog: Watchdog | None = None
        self._target_fds: list[int] = []  # pidfds of the traced processes
        self._stopping = False
        self._stop_ns: int | None = None  # the stop's time on the trace clock, when known
        self._end_requested = False
        self.group: str | None = None
        self.definitions: list[str] = []

    @property
    def pids(self) -> tuple[int, ...]:
        """The processes the session filters on (the command's pid with -c)."""
        return self._pids

    # -- availability ---------------------------------------------------------------------

    def available(self) -> Availability:
        try:
            tracefs = self._tracefs or Tracefs.discover()
        except EngineUnavailable as error:
            return Availability(False, error.message, error.hint)
        if self.kernel.lockdown == "confidentiality":
            return Availability(
                False,
                "kernel lockdown (confidentiality) forbids tracefs",
                "use --engine ptrace",
            )
        if not tracefs.exists("uprobe_events"):
            return Availability(
                False, "the kernel has no uprobe events (CONFIG_UPROBE_EVENTS is off)"
            )
        if not os.access(tracefs.root / "uprobe_events", os.W_OK):
            return Availability(
                False,
                "uprobe_events is not writable: not root",
                "run as root or use --engine ptrace",
            )
        return Availability(True)

    def unsupported(self, probes: Sequence[ResolvedProbe], *, auto: bool = False) -> str | None:
        return kernel_refusal(probes)  # what no uprobe_events line can carry: a Go string

    # -- attach ---------------------------------------------------------------------------

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None:
        refusal = kernel_refusal(probes)
        if refusal:
            raise EngineUnavailable(f"the tracefs engine cannot run {refusal}")
        tracefs = self._tracefs or Tracefs.discover()
        self._tracefs = tracefs
        dynamic = [p for p in probes if isinstance(p.spec, ProbeSpec)]
        tracepoints = plan_tracepoints(
            tracefs,
            [p.spec for p in probes if isinstance(p.spec, TracepointSpec)],
            self.options.default_filter,
        )
        functions = list(
            check_functions(
                tracefs,
                [p.spec for p in probes if isinstance(p.spec, FunctionSpec)],
                allow_all=self.options.allow_all_functions,
            )
        )
        filters = probe_filters(dynamic, self.options.default_filter)  # checked before any write
        _check_clock(tracefs, self.options.clock)
        self._reap_dead_sessions(tracefs)
        owner = Owner.current()
        serial = self._free_serial(tracefs, owner)
        self.group = owner.group_name(serial)
        self._installed.instance_name = owner.instance_name(serial)
        self._installed.group = self.group
        try:
            self._start_watchdog(tracefs)
            instance = Instance.create(tracefs, self._installed.instance_name)
            self._installed.instance = instance
            instance.tracing_on(False)
            instance.set_clock(self.options.clock)
            instance.set_option("record-tgid", True)
            if instance.exists("options/hash-ptr") and self.kernel.grammar.release >= (6, 2):
                # %p in tracepoint text: the kernel's hash key is secret, so the instance's own
                # `trace` prints real pointers like probescope. (6.1 prints every %s of a print
                # fmt empty with hash-ptr off; there the instance keeps the kernel default.)
                instance.set_option("hash-ptr", False)
            instance.set_buffer_size_kb(
                self.options.buffer_size_kb or _default_buffer_kb(len(instance.cpus()))
            )
            instance.set_buffer_percent(0)  # wake the recorder at the first event
            session = session_specs(dynamic, self.group)
            specs, self._types = session.specs, session.types
            expressions = event_filters(
                specs, [filters[p][0] if p in filters else None for p in dynamic]
            )
            user_stacks = self._user_stacks(specs)
            if user_stacks:
                # After each event the kernel records the user stack (frame pointers): a
                # `user_stack` record, printed `<user stack trace>` then ` =>  <address>`.
                instance.set_option("userstacktrace", True)
            if self.options.kernel_stack:
                # ... and the kernel stack with `stacktrace`: a `kernel_stack` record.
                instance.set_option("stacktrace", True)
            install(tracefs, specs, self._installed.events)
            self.definitions += [spec.definition() for spec in specs]
            set_event_filters(instance, self.group, expressions)
            self._decoder = session_decoder(
                instance,
                specs,
                self._types,
                tracepoints,
                functions=bool(functions),
                function_stack=self.options.function_stack,
                user_stacks=user_stacks,
                kernel_stacks=self.options.kernel_stack,
            )
            self._tasks = TaskNames(tracefs, self._decoder)
            pids = list(target.pids)
            if target.command:
                self._command = GatedCommand(target.command)
                pids = [self._command.start(target.on_spawn)]
            self._pids = tuple(pids)
            self._watch_targets(pids)
            if pids:
                instance.set_event_pids(pids, target.follow_children)
            if functions:
                # before the recorder opens trace_pipe_raw: 6.1 refuses it then (EBUSY)
                self._stats.notes += start_function_tracer(
                    instance,
                    functions,
                    pids,
                    follow=target.follow_children,
                    stack=self.options.function_stack,
                )
            layout = self._decoder.layout
            self._reader = PageSpool(
                {cpu: instance.trace_pipe_raw(cpu) for cpu in instance.cpus()},
                instance.subbuffer_size(),
                self.interval,
                is_partial=lambda page: read_header(layout, page).size < layout.data_size // 2,
                ring_empty=self._buffer_drained,
                final_drain_seconds=FINAL_DRAIN_SECONDS,
                wake_fds=self._target_fds,
                idle_wait=idle_wait_for(self.kernel.grammar.release),
            )
            self._reader.start()
            self._quiet(instance, functions=bool(functions))
            # Recording first, then the events: every hit the kernel counts is recorded.
            instance.tracing_on(True)
            if specs:
                enable_group(instance, self.group, specs)
            enable_tracepoints(instance, tracepoints)
            if self._command is not None:
                self._command.release()
        except BaseException:
            if self._command is not None:
                self._command.abort()
            self.detach()
            raise

    def _start_watchdog(self, tracefs: Tracefs) -> None:
        assert self._installed.instance_name is not None and self.group is not None
        try:
            self._watchdog = Watchdog.start(tracefs, self._installed.instance_name, self.group)
        except OSError as error:  # no pidfd_open (Linux < 5.3): the next run reaps instead
            self._stats.notes.append(
                f"no watchdog ({os.strerror(error.errno) if error.errno else error}): if this "
                "session is killed, its probes stay until `probescope cleanup` or the next run"
            )

    def _watch_targets(self, pids: Sequence[int]) -> None:
        """A pidfd per traced process: readable when it ends, which wakes the session."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                self._target_fds.append(os.pidfd_open(pid))

    def own_pids(self) -> list[int]:
        """The session's own tasks: its threads, the recorder, the watchdog."""
        pids = [int(tid) for tid in os.listdir("/proc/self/task")]
        if self._reader is not None and self._reader.recorder_pid is not None:
            pids.append(self._reader.recorder_pid)
        if self._watchdog is not None:
            pids.append(self._watchdog.pid)
        return pids

    def _quiet(self, instance: Instance, *, functions: bool) -> None:
        """Keep the session's own processes out of its trace (a system-wide trace would show
        the recorder's reads and the session's writes); the kernel leaves their children out
        too when event-fork is on, which is what a helper's helper should be."""
        pids = self.own_pids()
        if not instance.set_event_notrace_pids(pids):
            self._stats.notes.append(
                "this kernel has no set_event_notrace_pid: probescope's own processes may "
                "appear in a system-wide trace"
            )
        if functions and instance.exists("set_ftrace_notrace_pid"):
            instance.write("set_ftrace_notrace_pid", " ".join(map(str, pids)))

    def _reap_dead_sessions(self, tracefs: Tracefs) -> None:
        leftovers = find_leftovers(tracefs)
        if leftovers:
            errors = reap(tracefs, leftovers)
            self._stats.notes.append(
                f"removed {len(leftovers.describe())} leftovers of dead probescope sessions"
                + (f" ({len(errors)} could not be removed)" if errors else "")
            )

    @staticmethod
    def _free_serial(tracefs: Tracefs, owner: Owner) -> int:
        taken = set(tracefs.list_dir("instances"))
        serial = 0
        while owner.instance_name(serial) in taken:
            serial += 1
        return serial

    def _user_stacks(self, specs: Sequence[ProbeSpec]) -> bool:
        """User stacks were asked for and the session has user-space probes to take them at."""
        return self.options.user_stack and any(spec.kind.is_user for spec in specs)

    # -- events ---------------------------------------------------------------------------

    def _target_ended(self) -> bool:
        self._forget_ended_targets()
        command = self._command
        if command is not None:
            ended = command.returncode is None and command.pid is not None and command.exited()
            if ended and self._tasks is not None and command.pid is not None:
                self._tasks.pin(command.pid)
            return command.poll() is not None
        if self._pids:
            return not self._target_fds
        return False

    def _forget_ended_targets(self) -> None:
        """Close the pidfds of processes that ended (they would wake every wait from now on)."""
        if not self._target_fds:
            return
        poller = select.poll()
        for fd in self._target_fds:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            if self._reader is not None:
                self._reader.forget(fd)
            self._target_fds.remove(fd)
            os.close(fd)

    def _rounds(self) -> Iterator[tuple[list[tuple[int, bytes | None]], bool]]:
        """Each drain round of the recorder's spool: (cpu, sub-buffer or None when the reader
        caught up with that CPU) items, and whether it is the last round."""
        reader = self._reader
        if reader is None or self._decoder is None:
            raise ProbescopeError("the tracefs engine is not attached")
        ending = False
        while not self._detached:
            items = list(reader.drain())
            done = ending and reader.finished
            yield items, done
            if done:
                return
            if reader.more:
                continue
            if ending:
                reader.wait(0.005)
                continue
            if self._stopping or self._end_requested or self._target_ended():
                # The recorder copies what the last moments left in the ring buffer (it stops
                # when the buffer itself says it holds no more entries: a read can come back
                # empty while the kernel swaps its reader page); the spool is then read out.
                reader.finish()
                ending = True
                continue
            reader.wait()

    def events(self) -> Iterator[Event | EventBatch]:
        decoder = self._decoder
        if self._reader is None or decoder is None:
            raise ProbescopeError("the tracefs engine is not attached")
        merge = LiveMerge(self._reader.cpus)
        for items, done in self._rounds():
            if items and self._tasks is not None:
                self._tasks.refresh()
            for cpu, data in items:
                if data is None:
                    merge.caught_up(cpu)
                    continue
                batch = decoder.decode(data, cpu)
                if batch.lost:
                    self._page_lost += max(batch.lost, 1)  # -1: lost, count unknown
                    yield EventBatch([], batch.lost, batch.cpu)
                if self._tasks is not None:
                    self._tasks.name_new_tasks(batch)
                merge.add(batch)
            released = merge.flush() if done else merge.ready()
            yield self._before_stop(released) if self._stop_ns is not None else released

    def end(self) -> None:
        """End the stream as when the target ends: what is still in the ring buffer is copied
        and read out, then events() or sub_buffers() stop (a recording stopped by Ctrl-C or
        its duration keeps its last events)."""
        self._end_requested = True

    def sub_buffers(self) -> Iterator[tuple[int, bytes] | None]:
        """The raw sub-buffers as the recorder copied them, as (cpu, bytes), for consumers that
        read records themselves (a recording, an aggregation); None after each round (at
        least every ~100 ms, so the consumer can stop on time). Ends like events()."""
        for items, _ in self._rounds():
            for cpu, data in items:
                if data is not None:
                    yield cpu, data
            yield None

    def event_types(self) -> dict[int, EventType]:
        """The EventType of every event this session decodes, by event id."""
        return dict(self._decoder.event_types) if self._decoder is not None else {}

    def instance_files(self) -> InstanceFiles:
        """The instance's self-descriptions, task names and counters as the kernel wrote them,
        with the formats of every event this session decodes: what a recording carries. Read
        before detach (which removes the instance)."""
        instance = self._installed.instance
        if instance is None or self._decoder is None:
            raise ProbescopeError("the tracefs engine is not attached")
        return read_instance_files(instance, self._decoder.formats)

    def record_layout(self) -> tuple[SubBufferLayout, dict[int, tuple[EventFormat, EventType]]]:
        """The sub-buffer layout, and the format and EventType of each event id recorded."""
        if self._decoder is None:
            raise ProbescopeError("the tracefs engine is not attached")
        types = self._decoder.event_types
        formats = {f.id: f for f in self._decoder.formats}
        return self._decoder.layout, {i: (formats[i], types[i]) for i in types}

    def task_of(self, tid: int) -> tuple[str, int]:
        """(comm, tgid) of a thread as events name it: /proc first, then saved_cmdlines."""
        if self._tasks is None:
            raise ProbescopeError("the tracefs engine is not attached")
        return self._tasks.task(tid)

    def event_formats(self) -> tuple[EventFormat, ...]:
        """The `format` files of the events this session decodes (its probes, tracepoints and
        ftrace records), as read from its instance at attach: what a KernelContext needs to
        decode or print them elsewhere (`context.with_formats(engine.event_formats())`)."""
        return self._decoder.formats if self._decoder is not None else ()

    def _buffer_drained(self) -> bool:
        instance = self._installed.instance
        if instance is None:
            return True
        try:
            return all(instance.cpu_stats(cpu).entries == 0 for cpu in instance.cpus())
        except TracefsError:
            return True

    # -- stop and teardown ----------------------------------------------------------------

    def stop(self) -> None:
        """End the session at this moment (`-d`, `-n`, Ctrl-C). The probes are disabled
        (which waits until no handler runs: the kernel's hit counters are final) and tracing
        turned off; events() then delivers what the ring buffer holds of the time before the
        stop, counts what it holds of the time after as `hits_after_stop`, and ends. Every hit
        the kernel counted is then shown, after the stop, or not recorded (other processes,
        filters, loss)."""
        if self._stopping or self._detached:
            return
        self._stopping = True
        instance = self._installed.instance
        if instance is None:
            return
        clock = _CLOCKS.get(self.options.clock)
        if clock is not None:
            self._stop_ns = time.clock_gettime_ns(clock)
        with contextlib.suppress(TracefsError):
            if self._installed.events and self.group is not None:
                instance.enable_group(self.group, on=False)
        with contextlib.suppress(TracefsError):
            instance.tracing_on(False)

    def _before_stop(self, batch: EventBatch) -> EventBatch:
        """The events of `batch` up to the stop; those after it are counted, not delivered."""
        stop_ns = self._stop_ns
        events = batch.events
        if stop_ns is None or not events or events[-1].timestamp_ns <= stop_ns:
            return batch
        keep = bisect_right(events, stop_ns, key=_TIMESTAMP)
        after = self._stats.hits_after_stop
        for event in events[keep:]:
            name = f"{event.type.group}/{event.type.name}"
            after[name] = after.get(name, 0) + 1
        return EventBatch(events[:keep], batch.lost, batch.cpu)

    def stats(self) -> EngineStats:
        """Counters so far; while attached the loss is read live from the ring buffer."""
        if self._command is not None and self._command.returncode is not None:
            self._stats.command_status = self._command.returncode
        instance = self._installed.instance
        if instance is not None and not self._detached:
            with contextlib.suppress(TracefsError):
                self._ring_lost = sum(instance.cpu_stats(cpu).lost for cpu in instance.cpus())
        self._stats.lost = max(self._page_lost, self._ring_lost)
        self._stats.extra["ring_buffer_lost"] = self._ring_lost
        return self._stats

    def detach(self) -> None:
        if self._detached:
            return
        self._detached = True
        errors: list[ProbescopeError] = []
        if self._reader is not None:
            backlog = self._reader.backlog
            self._reader.close()
            if backlog:
                self._stats.notes.append(
                    f"{backlog} sub-buffers recorded but not decoded: the session ended before "
                    "the decoder caught up with the recorder"
                )
        if self._tracefs is not None:
            hits, misses = read_profiles(self._tracefs, self._installed.events, self._types)
            self._stats.hits.update(hits)
            self._stats.misses.update(misses)
        instance = self._installed.instance
        if instance is not None:
            with contextlib.suppress(TracefsError):
                self._ring_lost = sum(instance.cpu_stats(cpu).lost for cpu in instance.cpus())
            try:
                instance.remove()
            except TracefsError as error:
                errors.append(error)
        if self._tracefs is not None:
            for events_file, names in self._installed.events.items():
                errors += DynamicEvents(self._tracefs, events_file).remove(names)
            errors += self._sweep(self._tracefs)
        for fd in self._target_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._target_fds.clear()
        if self._watchdog is not None:
            self._watchdog.stand_down()
        if self._command is not None and self._command.poll() is None:
            self._command.terminate()
            self._stats.notes.append(
                f"{self._command.argv[0]} (pid {self._command.pid}) was still running: "
                f"terminated, status {self._command.returncode}"
            )
        if errors:
            raise TracefsError(
                "teardown left kernel state behind: " + "; ".join(e.message for e in errors),
                hint="run `probescope cleanup --all` once the cause is fixed",
            )

    def _sweep(self, tracefs: Tracefs) -> list[TracefsError]:
        """Whatever still carries this session's names: what a signal cut off between the
        kernel creating an object and this engine recording it."""
        name, group = self._installed.instance_name, self._installed.group
        if name is None or group is None:
            return []
        try:
            return reap(tracefs, leftovers_named(tracefs, name, group))
        except TracefsError as error:
            return [error]


def _check_clock(tracefs: Tracefs, clock: str) -> None:
    """The trace clock is one this kernel has (its instances offer the top level's), before
    anything is created."""
    text = tracefs.read("trace_clock") if tracefs.exists("trace_clock") else ""
    available = text.replace("[", "").replace("]", "").split()
    if available and clock not in available:
        raise ProbescopeError(
            f"trace clock {clock!r} is not available",
            hint=f"choose one of: {', '.join(available)}",
        )


_CLOCKS = {
    "mono": time.CLOCK_MONOTONIC,
    "mono_raw": time.CLOCK_MONOTONIC_RAW,
    "boot": time.CLOCK_BOOTTIME,
    "tai": time.CLOCK_TAI,
}
"""Trace clocks that read as a clock_gettime() clock: the stop's time can be placed among
events. (With another clock everything recorded before the probes were disabled is shown.)"""
_TIMESTAMP = operator.attrgetter("timestamp_ns")


def _default_buffer_kb(cpus: int) -> int:
    """Ring buffer per CPU: 64 MiB of kernel memory in all, 1.4 to 16 MiB per CPU — enough
    for bursts of several hundred thousand events per second while the reader catches up."""
    return max(1410, min(16384, 65536 // max(cpus, 1)))
