"""The tracefs engine: the kernel's own uprobes (and kprobes, tracepoints, the function
tracer), recorded in a private instance and read back from the binary ring buffer.

attach: reap leftovers of dead sessions → create instance `probescope-<pid>-<start>-<n>` →
define every probe in group `probescope_<pid>_<start>_<n>` (one batched write,
`session_events`) → read the formats and build the decoder (`event_formats`) → filter pids
(set_event_pid + event-fork) → enable the group, the tracepoints and the function tracer
(`function_tracer`) in the instance only → start the recorder (`spool`). Streaming decodes
sub-buffers (`traceevent`), names tasks (`task_names`) and merges CPUs in time order.
detach: close readers → read the kernel's counters (`profiles`) and the loss counters → rmdir
the instance (which disables its events) → remove the group's definitions. Every step of
detach runs even if an earlier one failed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from probescope.engines.base import Availability, EngineOptions, EngineStats, Target
from probescope.engines.launch import GatedCommand
from probescope.engines.tracefs.dynamic_events import DynamicEvents, EventName
from probescope.engines.tracefs.event_formats import session_decoder
from probescope.engines.tracefs.function_tracer import start_function_tracer
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.instance_files import InstanceFiles, read_instance_files
from probescope.engines.tracefs.ownership import Owner
from probescope.engines.tracefs.profiles import read_profiles
from probescope.engines.tracefs.reaper import find_leftovers, reap
from probescope.engines.tracefs.session_events import (
    enable_group,
    enable_tracepoints,
    install,
    session_specs,
)
from probescope.engines.tracefs.spool import PageSpool
from probescope.engines.tracefs.static_plan import check_functions, plan_tracepoints
from probescope.engines.tracefs.task_names import TaskNames
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import EngineUnavailable, ProbescopeError, TracefsError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import FunctionSpec, TracepointSpec
from probescope.system.kernel import RunningKernel
from probescope.system.procfs import status_fields
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.format import EventFormat
from probescope.traceevent.merge import LiveMerge
from probescope.traceevent.ringbuffer import read_header

FINAL_DRAIN_SECONDS = 2.0


@dataclass
class _Installed:
    """What attach created, so detach knows exactly what to undo."""

    instance: Instance | None = None
    events: dict[str, list[EventName]] = field(default_factory=dict)


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
        self.interval = interval
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

    # -- attach ---------------------------------------------------------------------------

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None:
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
        self._reap_dead_sessions(tracefs)
        owner = Owner.current()
        serial = self._free_serial(tracefs, owner)
        self.group = owner.group_name(serial)
        try:
            instance = Instance.create(tracefs, owner.instance_name(serial))
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
            session = session_specs(dynamic, self.group)
            specs, self._types = session.specs, session.types
            user_stacks = self._user_stacks(specs)
            if user_stacks:
                # After each event the kernel records the user stack (frame pointers): a
                # `user_stack` record, printed `<user stack trace>` then ` =>  <address>`.
                instance.set_option("userstacktrace", True)
            install(tracefs, specs, self._installed.events)
            self.definitions += [spec.definition() for spec in specs]
            self._decoder = session_decoder(
                instance,
                specs,
                self._types,
                tracepoints,
                functions=bool(functions),
                function_stack=self.options.function_stack,
                user_stacks=user_stacks,
            )
            self._tasks = TaskNames(tracefs, self._decoder)
            pids = list(target.pids)
            if target.command:
                self._command = GatedCommand(target.command)
                pids = [self._command.start()]
            self._pids = tuple(pids)
            if pids:
                instance.set_event_pids(pids, target.follow_children)
            if specs:
                enable_group(instance, self.group, specs)
            enable_tracepoints(instance, tracepoints)
            if functions:
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
            )
            self._reader.start()
            instance.tracing_on(True)
            if self._command is not None:
                self._command.release()
        except BaseException:
            if self._command is not None:
                self._command.abort()
            self.detach()
            raise

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
        command = self._command
        if command is not None:
            ended = command.returncode is None and command.pid is not None and command.exited()
            if ended and self._tasks is not None and command.pid is not None:
                self._tasks.pin(command.pid)
            return command.poll() is not None
        if self._pids:
            return not any(_running(pid) for pid in self._pids)
        return False

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
            if self._end_requested or self._target_ended():
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
            yield merge.flush() if done else merge.ready()

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

    # -- teardown -------------------------------------------------------------------------

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


def _default_buffer_kb(cpus: int) -> int:
    """Ring buffer per CPU: 64 MiB of kernel memory in all, 1.4 to 16 MiB per CPU — enough
    for bursts of several hundred thousand events per second while the reader catches up."""
    return max(1410, min(16384, 65536 // max(cpus, 1)))


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent."""
    return status_fields(pid).get("State", "Z")[:1] not in ("Z", "X")
