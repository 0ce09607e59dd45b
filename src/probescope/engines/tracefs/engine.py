"""The tracefs engine: the kernel's own uprobes (and kprobes), recorded in a private instance
and read back from the binary ring buffer.

attach: reap leftovers of dead sessions → create instance `probescope-<pid>-<start>-<n>` →
define every probe in group `probescope_<pid>_<start>_<n>` (one batched write) → read the
formats → filter pids (set_event_pid + event-fork) → enable the group in the instance only.
detach: close readers → read the loss counters → rmdir the instance (which disables its events)
→ remove the group's definitions. Every step of detach runs even if an earlier one failed.
"""

from __future__ import annotations

import contextlib
import operator
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from probescope.engines.base import Availability, EngineOptions, EngineStats, Target
from probescope.engines.launch import GatedCommand
from probescope.engines.tracefs.decoder import EventDecoder, LiveMerge
from probescope.engines.tracefs.dynamic_events import DynamicEvents, EventName
from probescope.engines.tracefs.format import (
    EventFormat,
    parse_event_format,
    parse_header_page,
    parse_saved_cmdlines,
    parse_saved_tgids,
)
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.ownership import Owner
from probescope.engines.tracefs.reaper import find_leftovers, reap
from probescope.engines.tracefs.ringbuffer import SubBufferLayout, read_header
from probescope.engines.tracefs.spool import PageSpool
from probescope.engines.tracefs.static_plan import (
    TracepointPlan,
    check_functions,
    plan_tracepoints,
)
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import EngineUnavailable, ProbescopeError, TracefsError
from probescope.events import Event, EventBatch, EventType
from probescope.language.kinds import BY_KIND
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import FunctionSpec, TracepointSpec
from probescope.system.kernel import RunningKernel

UNKNOWN_COMM = "<...>"
FINAL_DRAIN_SECONDS = 2.0
COMM_REFRESH_SECONDS = 0.05
_TID = operator.itemgetter(3)


@dataclass
class _Installed:
    """What attach created, so detach knows exactly what to undo."""

    instance: Instance | None = None
    events: dict[str, list[EventName]] = field(default_factory=dict)


class TracefsEngine:
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
        self._tasks_checked: set[int] = set()
        self._pinned_comms: dict[int, str] = {}
        self._comms_read_at = 0.0
        self._stats = EngineStats(hits_title="kernel hits (all processes)")
        self._page_lost = 0
        self._ring_lost = 0
        self._detached = False
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
            if self.options.kernel_stack_trace:
                instance.set_option("stacktrace", True)
            if self.options.user_stack_trace:
                instance.set_option("userstacktrace", True)
            specs = self._session_specs(dynamic)
            self._install(tracefs, specs)
            self._decoder = self._build_decoder(instance, specs, tracepoints, bool(functions))
            pids = list(target.pids)
            if target.command:
                self._command = GatedCommand(target.command)
                pids = [self._command.start()]
            self._pids = tuple(pids)
            if pids:
                instance.set_event_pids(pids, target.follow_children)
            if specs:
                self._enable(instance, specs)
            self._enable_tracepoints(instance, tracepoints)
            if functions:
                self._start_function_tracer(instance, functions, pids, target.follow_children)
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

    def _session_specs(self, probes: Sequence[ResolvedProbe]) -> list[ProbeSpec]:
        """Every probe renamed into the session group, with one EventType per event name."""
        assert self.group is not None
        names: dict[tuple[str, str], str] = {}
        used: set[str] = set()
        specs = []
        for probe in probes:
            spec = probe.spec
            assert isinstance(spec, ProbeSpec)
            key = (spec.group_name, spec.event_name)
            name = names.get(key)
            if name is None:
                name = spec.event_name
                serial = 1
                while name in used:
                    name = f"{spec.event_name[:58]}_{serial}"
                    serial += 1
                names[key] = name
                used.add(name)
                self._types[name] = EventType(
                    group=spec.group_name,
                    name=name,
                    kind=probe.kind,
                    arg_names=tuple(a.name for a in spec.args),
                    arg_types=tuple(a.type for a in spec.args),
                )
            specs.append(replace(spec, group=self.group, event=name))
        return specs

    def _install(self, tracefs: Tracefs, specs: list[ProbeSpec]) -> None:
        by_file: dict[str, list[ProbeSpec]] = {}
        for spec in specs:
            by_file.setdefault(BY_KIND[spec.kind].events_file, []).append(spec)
        for events_file, file_specs in by_file.items():
            events = DynamicEvents(tracefs, events_file)
            if not events.available():
                raise TracefsError(
                    f"this kernel has no {events_file}",
                    hint="kprobes need CONFIG_KPROBE_EVENTS" if "kprobe" in events_file else None,
                )
            events.install(file_specs)
            self.definitions += [spec.definition() for spec in file_specs]
            self._installed.events[events_file] = sorted(
                {EventName(s.group_name, s.event_name) for s in file_specs},
                key=str,
            )

    def _build_decoder(
        self,
        instance: Instance,
        specs: list[ProbeSpec],
        tracepoints: list[TracepointPlan],
        functions: bool,
    ) -> EventDecoder:
        layout = SubBufferLayout.from_header_page(
            parse_header_page(instance.read("events/header_page")),
            sub_buffer_size=instance.subbuffer_size(),
        )
        decoder = EventDecoder(layout)
        added: set[str] = set()
        for spec in specs:
            if spec.event_name in added:
                continue
            added.add(spec.event_name)
            event_format = parse_event_format(
                instance.event_format(spec.group_name, spec.event_name), system=spec.group_name
            )
            decoder.add_event(event_format, probe=spec, event_type=self._types[spec.event_name])
        for plan in tracepoints:
            decoder.add_event(plan.format, kind=ProbeKind.TRACEPOINT, group=plan.system)
        if functions:
            function_format = parse_event_format(
                instance.read("events/ftrace/function/format"), system="ftrace"
            )
            decoder.add_event(function_format, kind=ProbeKind.FUNCTION, group="ftrace")
        if self.options.kernel_stack_trace or (functions and self.options.function_stack):
            decoder.add_event(
                _open_tail(instance, "kernel_stack", "caller"),
                kind=ProbeKind.FUNCTION,
                group="ftrace",
            )
        if self.options.user_stack_trace:
            decoder.add_event(
                parse_event_format(
                    instance.read("events/ftrace/user_stack/format"), system="ftrace"
                ),
                kind=ProbeKind.FUNCTION,
                group="ftrace",
            )
        return decoder

    @staticmethod
    def _enable_tracepoints(instance: Instance, plans: list[TracepointPlan]) -> None:
        for plan in plans:
            if plan.filter:
                instance.clear_error_log()
                try:
                    instance.set_filter(plan.system, plan.event, plan.filter)
                except TracefsError as error:
                    entries = instance.error_log()
                    reason = entries[-1].message if entries else error.message
                    raise TracefsError(
                        f"the kernel refused the filter for {plan.system}:{plan.event}: {reason}",
                        command=entries[-1].command if entries else plan.filter,
                        column=entries[-1].column if entries else None,
                    ) from None
            instance.enable_event(plan.system, plan.event)

    def _start_function_tracer(
        self, instance: Instance, functions: list[FunctionSpec], pids: list[int], follow: bool
    ) -> None:
        """Filter first, then switch the instance's tracer: an empty filter would trace
        every function of the kernel for a moment."""
        for file_name, selected in (
            ("set_ftrace_filter", [f for f in functions if not f.exclude]),
            ("set_ftrace_notrace", [f for f in functions if f.exclude]),
        ):
            for index, spec in enumerate(selected):
                if index == 0:
                    instance.write(file_name, spec.pattern)
                else:
                    instance.append(file_name, spec.pattern)
        if self.options.function_stack:
            instance.set_option("func_stack_trace", True)
        if any(f.traces_everything or f.exclude for f in functions):
            self._stats.notes.append(
                "tracing (nearly) every kernel function: expect the machine to slow down"
            )
        if pids:
            instance.set_option("function-fork", follow)
            instance.write("set_ftrace_pid", " ".join(str(p) for p in pids))
        try:
            instance.write("current_tracer", "function")
        except TracefsError as error:
            raise TracefsError(
                f"the kernel refused the function tracer: {error.message}",
                hint="this kernel forbids ftrace function tracing here",
                path=error.path,
            ) from None

    def _enable(self, instance: Instance, specs: list[ProbeSpec]) -> None:
        """Enable the whole group in one write; if the kernel refuses, find each probe it
        refuses (bad instruction, offset past the file) and say which."""
        assert self.group is not None
        try:
            instance.enable_group(self.group)
            return
        except TracefsError as error:
            first_error = error
        instance.enable_group(self.group, on=False)
        refused = []
        for spec in specs:
            try:
                instance.enable_event(self.group, spec.event_name)
                instance.enable_event(self.group, spec.event_name, on=False)
            except TracefsError as error:
                refused.append(
                    f"{spec.source or spec.definition()}: {error.message.rsplit(': ', 1)[-1]}"
                )
        raise TracefsError(
            "the kernel refused to arm " + ("; ".join(refused) if refused else first_error.message),
            hint="the kernel checks the instruction at each offset when a probe is enabled: "
            "an offset inside an instruction, past the end of the file, or on an instruction "
            "uprobes cannot step (syscall, int3, ...) is refused",
        )

    # -- events ---------------------------------------------------------------------------

    def _refresh_comms(self, decoder: EventDecoder) -> None:
        """Follow renames (exec, prctl) the way the kernel's own printer does: saved_cmdlines,
        read again at most every COMM_REFRESH_SECONDS, names the tasks of the next records."""
        now = time.monotonic()
        if now - self._comms_read_at < COMM_REFRESH_SECONDS or self._tracefs is None:
            return
        self._comms_read_at = now
        with contextlib.suppress(TracefsError):
            decoder.update_comms(parse_saved_cmdlines(self._tracefs.read("saved_cmdlines")))
            decoder.update_comms(self._pinned_comms)

    def _name_tasks(self, decoder: EventDecoder, batch: EventBatch) -> None:
        """Records carry only the thread id. The kernel names tasks in saved_cmdlines and
        saved_tgids (record-tgid is on in our instance) at each CPU's next context switch,
        so a task seen for the first time is looked up in /proc, then there."""
        checked = self._tasks_checked
        fresh = set(map(_TID, batch.events)) - checked
        if not fresh or self._tracefs is None:
            return
        saved_comms = parse_saved_cmdlines(self._tracefs.read("saved_cmdlines"))
        saved_tgids = parse_saved_tgids(self._tracefs.read("saved_tgids"))
        comms: dict[int, str] = {}
        tgids: dict[int, int] = {}
        for tid in fresh:
            checked.add(tid)
            # A live task's own name first: saved_cmdlines may still hold the name of an
            # earlier task with the same pid, and the kernel's `trace` prints the latest name.
            comm, tgid = _task_of(tid)
            comm = comm or saved_comms.get(tid)
            tgid = tgid or saved_tgids.get(tid)
            if comm is not None:
                comms[tid] = comm
            if tgid is not None:
                tgids[tid] = tgid
        comms.update((tid, self._pinned_comms[tid]) for tid in fresh & self._pinned_comms.keys())
        decoder.update_comms(comms)
        decoder.update_tgids(tgids)
        batch.events[:] = [
            e._replace(
                pid=tgids.get(e.tid, e.pid),
                comm=comms.get(e.tid, e.comm),
            )
            if e.tid in fresh
            else e
            for e in batch.events
        ]

    def _pin_comm(self, pid: int) -> None:
        """Name the command's process from /proc while it is a zombie, before reaping it: the
        decoder may still be behind on its records, and saved_cmdlines may not have it (the
        kernel saves a name at the task's next context switch, if ever) or may hold the name
        of an earlier process with the same pid."""
        comm, tgid = _task_of(pid)
        if comm is not None and self._decoder is not None:
            self._pinned_comms[pid] = comm
            self._decoder.update_comms({pid: comm})
            if tgid is not None:
                self._decoder.update_tgids({pid: tgid})

    def _target_ended(self) -> bool:
        command = self._command
        if command is not None:
            if command.returncode is None and command.pid is not None and command.exited():
                self._pin_comm(command.pid)
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
            if self._target_ended():
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
            if items:
                self._refresh_comms(decoder)
            for cpu, data in items:
                if data is None:
                    merge.caught_up(cpu)
                    continue
                batch = decoder.decode(data, cpu)
                if batch.lost:
                    self._page_lost += max(batch.lost, 1)  # -1: lost, count unknown
                    yield EventBatch([], batch.lost, batch.cpu)
                self._name_tasks(decoder, batch)
                merge.add(batch)
            yield merge.flush() if done else merge.ready()

    def sub_buffers(self) -> Iterator[tuple[int, bytes] | None]:
        """The raw sub-buffers as the recorder copied them, as (cpu, bytes), for consumers that
        read records themselves (aggregations); None after each round (at least every ~100 ms,
        so the consumer can stop on time). Ends like events(). Losses are in the headers."""
        for items, _ in self._rounds():
            for cpu, data in items:
                if data is not None:
                    yield cpu, data
            yield None

    def record_layout(self) -> tuple[SubBufferLayout, dict[int, tuple[EventFormat, EventType]]]:
        """The sub-buffer layout, and the format and EventType of each event id recorded."""
        if self._decoder is None:
            raise ProbescopeError("the tracefs engine is not attached")
        types = self._decoder.event_types
        formats = self._decoder.formats
        return self._decoder.layout, {i: (formats[i], types[i]) for i in types}

    def task_of(self, tid: int) -> tuple[str, int]:
        """(comm, tgid) of a thread as events name it: /proc first, then saved_cmdlines."""
        comm, tgid = _task_of(tid)
        if (comm is None or tgid is None) and self._tracefs is not None:
            with contextlib.suppress(TracefsError):
                if comm is None:
                    comm = parse_saved_cmdlines(self._tracefs.read("saved_cmdlines")).get(tid)
                if tgid is None:
                    tgid = parse_saved_tgids(self._tracefs.read("saved_tgids")).get(tid)
        return comm or UNKNOWN_COMM, tgid or tid

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

    def _read_profiles(self) -> None:
        """The kernel's own per-probe counters: uprobe hits (every process, before pid
        filtering) and kprobe hits and misses (`kprobe_profile`)."""
        if self._tracefs is None:
            return
        ours = {name.event for names in self._installed.events.values() for name in names}
        for events_file, profile in (
            ("uprobe_events", "uprobe_profile"),
            ("kprobe_events", "kprobe_profile"),
        ):
            if events_file not in self._installed.events or not self._tracefs.exists(profile):
                continue
            try:
                text = self._tracefs.read(profile)
            except TracefsError:
                continue
            for line in text.splitlines():
                words = line.split()
                counts = [w for w in words if w.isdigit()]
                names = [w for w in words if w in ours]
                if not names or not counts:
                    continue
                event_type = self._types.get(names[-1])
                if event_type is None:
                    continue
                key = f"{event_type.group}/{event_type.name}"
                if profile == "kprobe_profile" and len(counts) >= 2:
                    self._stats.hits[key] = int(counts[-2])
                    self._stats.misses[key] = int(counts[-1])
                else:
                    self._stats.hits[key] = self._stats.hits.get(key, 0) + int(counts[-1])

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
        self._read_profiles()
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


def _task_of(tid: int) -> tuple[str | None, int | None]:
    """(comm, tgid) of a live thread from /proc, Nones when it is gone."""
    comm = tgid = None
    try:
        with open(f"/proc/{tid}/status") as status:
            for line in status:
                if line.startswith("Name:"):
                    comm = line[5:].strip()
                elif line.startswith("Tgid:"):
                    tgid = int(line.split()[1])
                    break
    except OSError:
        pass
    return comm, tgid


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _open_tail(instance: Instance, event: str, field_name: str) -> EventFormat:
    """An ftrace record format whose last array really runs to the end of each record (the
    `format` file shows a fixed length): decode it as the rest of the record."""
    event_format = parse_event_format(
        instance.read(f"events/ftrace/{event}/format"), system="ftrace"
    )
    fields = tuple(
        replace(f, size=0, array_length=None) if f.name == field_name else f
        for f in event_format.fields
    )
    return replace(event_format, fields=fields)
