"""The bpf engine: the probes compiled to BPF programs in Python, attached with uprobe_multi
links (the uprobe PMU where those are missing) and tracepoint perf events, their hits streamed
through one BPF ring buffer into the same `Event`s the tracefs engine produces.

attach: probe the kernel's BPF features → plan (groups, event types, filters) → maps (ring,
counters, pid map, scratch) → load programs → pid map + fork/exit tracker → start the command
gated → attach every link → let the command exec. detach: close links, programs, maps. Every
kernel object is a file descriptor of this process, so a SIGKILLed session leaves nothing: the
kernel removes the breakpoints when the last descriptor closes.

The flags column (irqs-off, need-resched, hardirq/softirq, preempt depth) of a uprobe event is
not known to a BPF program; the engine reports 0 (`.....`), what a uprobe handler in task
context with preemption enabled has. Tracepoint records carry the kernel's own flags.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from probescope.engines.aggregation import KernelAggregation, KernelValues
from probescope.engines.base import Availability, EngineOptions, EngineStats, Target
from probescope.engines.bpf.abi import AttachType
from probescope.engines.bpf.attach import uprobe_pmu_type
from probescope.engines.bpf.attachments import Attachments
from probescope.engines.bpf.capability import BpfFeatures, probe_features
from probescope.engines.bpf.decode import RecordDecoder
from probescope.engines.bpf.kernel_aggregation import KernelAggregator, aggregation_refusal
from probescope.engines.bpf.maps import ArrayMap, HashMap, possible_cpus
from probescope.engines.bpf.plan import (
    UprobePlan,
    check_expressible,
    plan_uprobes,
    tracepoint_code,
)
from probescope.engines.bpf.program import (
    CLOCKS,
    COUNTER_FILTERED,
    COUNTER_LOST,
    SCRATCH_SLOTS_PER_CPU,
    RecordAction,
    SharedMaps,
    build_record_program,
)
from probescope.engines.bpf.regs import pt_regs_for
from probescope.engines.bpf.ringbuf import RingBuffer
from probescope.engines.bpf.stream import EventStream
from probescope.engines.bpf.tracepoints import (
    TRACEPOINT_SCRATCH_SIZE,
    TracepointCode,
    build_tracepoint_program,
    compile_tracepoint_decoder,
    tracepoint_event_type,
)
from probescope.engines.launch import GatedCommand
from probescope.errors import (
    BpfError,
    EngineUnavailable,
    ProbescopeError,
    SpecError,
    SpecErrors,
    SymbolError,
)
from probescope.events import Event, EventBatch
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import TracepointSpec
from probescope.system.kernel import RunningKernel

DEFAULT_RING_BYTES = 32 << 20
KINDS = frozenset({ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.USDT, ProbeKind.TRACEPOINT})


class BpfEngine:
    name = "bpf"

    def __init__(
        self,
        *,
        options: EngineOptions | None = None,
        kernel: RunningKernel | None = None,
        attach_mode: str = "auto",
        interval: float = 0.1,
    ) -> None:
        """`attach_mode`: `auto` (uprobe_multi where the kernel has it), `multi` or `pmu`
        (one perf event per probe, the fallback; kept selectable for tests and comparison)."""
        self.options = options or EngineOptions()
        self.kernel = kernel
        self.attach_mode = attach_mode
        self.interval = interval
        self._features: BpfFeatures | None = None
        self._owned = Attachments()
        self._decoder = RecordDecoder()
        self._command: GatedCommand | None = None
        self._pids: tuple[int, ...] = ()
        self._stats = EngineStats()
        self._lost_seen = 0
        self._counters: ArrayMap | None = None
        self._detached = False
        self._attached = False
        self._aggregator: KernelAggregator | None = None
        self._stream: EventStream | None = None  # the recorder process and the decoder behind it

    @property
    def pids(self) -> tuple[int, ...]:
        return self._pids

    # -- availability ---------------------------------------------------------------------

    def features(self) -> BpfFeatures:
        if self._features is None:
            self._features = probe_features()
        return self._features

    def available(self) -> Availability:
        features = self.features()
        if not features.usable:
            return Availability(False, features.reason, features.hint)
        return Availability(True, "; ".join(features.notes))

    def unsupported(self, probes: Sequence[ResolvedProbe], *, auto: bool = False) -> str | None:
        """Why these probes cannot run here (None when they can). For `auto`, a kernel with
        only the uprobe PMU is passed over too: it detaches about ten probes a second, and
        before Linux 6.6 it cannot name a return probe's function."""
        features = self.features()
        pmu_only = features.usable and not features.uprobe_multi
        if auto and pmu_only and any(p.kind is not ProbeKind.TRACEPOINT for p in probes):
            return "uprobes here: the kernel has no uprobe_multi links (--engine bpf uses its PMU)"
        kinds = sorted({p.kind.value for p in probes if p.kind not in KINDS})
        if kinds:
            return f"{', '.join(kinds)} probes"
        if self.options.clock not in CLOCKS:
            return f"with trace clock {self.options.clock!r} (it reads mono or boot)"
        if self.options.user_stack or self.options.kernel_stack:
            return "stack records after events (the tracefs engine's (user)stacktrace)"
        if self.options.aggregation is not None:
            return self.can_aggregate(self.options.aggregation, probes)
        return check_expressible(probes)

    def can_aggregate(
        self, aggregation: KernelAggregation, probes: Sequence[ResolvedProbe]
    ) -> str | None:
        """Why these probes cannot be aggregated in the kernel here (None when they can)."""
        if not self.features().usable:
            return self.features().reason
        return aggregation_refusal(aggregation, probes, default_filter=self.options.default_filter)

    # -- attach ---------------------------------------------------------------------------

    def attach(self, probes: Sequence[ResolvedProbe], target: Target) -> None:
        if self._attached:
            raise BpfError("this engine is already attached; use a new BpfEngine")
        self._attached = True
        features = self.features()
        if not features.usable:
            raise EngineUnavailable(f"the bpf engine cannot run here: {features.reason}")
        mode = self._mode(features)
        if self.options.clock not in CLOCKS:
            raise EngineUnavailable(
                f"the bpf engine reads the mono or boot clock, not {self.options.clock!r}",
                hint="use --clock mono (CLOCK_MONOTONIC) or boot, or --engine tracefs",
            )
        unsupported = sorted({p.kind.value for p in probes if p.kind not in KINDS})
        if unsupported:
            raise EngineUnavailable(
                f"the bpf engine cannot run {', '.join(unsupported)} probes",
                hint="choose --engine tracefs",
            )
        uprobes = [p for p in probes if isinstance(p.spec, ProbeSpec)]
        _check_instruction_boundaries(uprobes)
        tracepoint_specs = [p.spec for p in probes if isinstance(p.spec, TracepointSpec)]
        aggregation = self.options.aggregation
        if aggregation is not None:
            refusal = self.can_aggregate(aggregation, probes)
            if refusal:
                raise EngineUnavailable(f"the bpf engine cannot aggregate {refusal}")
        else:
            plan = plan_uprobes(uprobes, self.options.default_filter)
        tracepoints = self._plan_tracepoints(tracepoint_specs, len(uprobes))
        try:
            pid_map: int | None = None
            if aggregation is None:
                maps = self._create_maps(plan, bool(tracepoints), target)
                self._start_stream()
                self._start_command(target)
                if maps.pids is not None and len(self._pids) == 1:
                    # the one traced process passes on a comparison, its children by the map;
                    # its pid cannot be reused by another before the session, ending with it,
                    # detaches
                    maps = replace(maps, known_pids=self._pids)
                self._load_uprobe_programs(plan, maps, mode, sleepable=features.sleepable)
                loaded_tracepoints = self._load_tracepoints(tracepoints, maps)
                pid_map = maps.pids
            else:
                self._aggregator = KernelAggregator(
                    aggregation, self._owned, pt_regs_for(os.uname().machine)
                )
                loaded_tracepoints, pids = self._aggregator.load(
                    uprobes, tracepoints, system_wide=target.system_wide
                )
                pid_map = pids.fd if pids is not None else None
                self._start_command(target)
            # the session's own tracepoint programs run before the exit tracker (programs of
            # one tracepoint run in attach order), so a traced process's last events pass
            for program_fd, event_id, label in loaded_tracepoints:
                self._owned.attach_tracepoint(program_fd, event_id, label)
            self._filter_pids(pid_map, target)
            if self._aggregator is not None:
                self._aggregator.attach_uprobes(mode)
            else:
                self._attach_uprobes(plan, mode)
            self._stats.extra.update(
                programs=len(self._owned.programs),
                links=len(self._owned.links) + len(self._owned.trackers) // 2,
                perf_events=len(self._owned.perf_events) + len(self._owned.trackers) // 2,
            )
            if self._command is not None:
                self._command.release()
        except BaseException:
            if self._command is not None:
                self._command.abort()
            self.detach()
            raise

    def _start_command(self, target: Target) -> None:
        """The -c command, started gated (before the programs that compare its pid load), or
        the pids given; the event stream watches them end."""
        if target.command:
            self._command = GatedCommand(target.command)
            self._pids = (self._command.start(target.on_spawn),)
        else:
            self._pids = tuple(target.pids)
        if self._stream is not None:
            self._stream.watch_target(self._pids)

    def _mode(self, features: BpfFeatures) -> str:
        if self.attach_mode == "pmu":
            if not features.uprobe_pmu and uprobe_pmu_type() is None:
                raise EngineUnavailable("the kernel has no uprobe PMU")
            return "pmu"
        if self.attach_mode == "multi" and not features.uprobe_multi:
            raise EngineUnavailable(f"uprobe_multi links are refused here: {features.reason}")
        return "multi" if features.uprobe_multi else "pmu"

    def _plan_tracepoints(
        self, specs: list[TracepointSpec], first_index: int
    ) -> list[tuple[int, TracepointCode, int]]:
        """Tracepoints as the tracefs engine expands and checks them (globs, filters against
        the fields), each with its compiled filter and its event id."""
        if not specs:
            return []
        from probescope.engines.tracefs.static_plan import plan_tracepoints
        from probescope.engines.tracefs.tracefs import Tracefs

        tracefs = Tracefs.discover()
        plans = plan_tracepoints(tracefs, specs, self.options.default_filter)
        planned: list[tuple[int, TracepointCode, int]] = []
        for number, tracepoint in enumerate(plans):
            source = next(
                (
                    s.source or str(s)
                    for s in specs
                    if fnmatch.fnmatchcase(tracepoint.system, s.system)
                    and fnmatch.fnmatchcase(tracepoint.event, s.event)
                ),
                "",
            )
            code = tracepoint_code(
                tracepoint.system, tracepoint.event, tracepoint.format, tracepoint.filter, source
            )
            event_id = int(tracefs.read(f"events/{tracepoint.system}/{tracepoint.event}/id"))
            planned.append((first_index + number, code, event_id))
        return planned

    def _create_maps(self, plan: UprobePlan, tracepoints: bool, target: Target) -> SharedMaps:
        owned = self._owned
        ring_bytes = _ring_size(self.options.buffer_size_kb)
        owned.ring = RingBuffer("probescope_rb", ring_bytes)
        self._counters = ArrayMap("probescope_cnt", 8, 4)
        owned.maps.append(self._counters)
        pids = None
        if not target.system_wide:
            pid_map = HashMap("probescope_pid", 4, 8, 1 << 16)
            owned.maps.append(pid_map)
            pids = pid_map.fd
        scratch = max(plan.scratch_size, TRACEPOINT_SCRATCH_SIZE if tracepoints else 0)
        self._claim_offset = (scratch + 7) & ~7
        self._scratch_fd: int | None = None
        if scratch:
            scratch_map = ArrayMap(
                "probescope_scr",
                self._claim_offset + 8,
                possible_cpus() * SCRATCH_SLOTS_PER_CPU,
            )
            owned.maps.append(scratch_map)
            self._scratch_fd = scratch_map.fd
        return SharedMaps(owned.ring.fd, self._counters.fd, pids)

    def _load_uprobe_programs(
        self, plan: UprobePlan, maps: SharedMaps, mode: str, *, sleepable: bool
    ) -> None:
        """One program per group. Sleepable programs (which fault user pages in) attach only
        through uprobe_multi links."""
        regs = pt_regs_for(os.uname().machine)
        action = RecordAction(maps, self._scratch_fd, self._claim_offset)
        self._group_programs: list[int] = []
        self._plan = plan
        for number, group in enumerate(plan.groups):
            index, first = group.members[0]
            label = first.spec.source if isinstance(first.spec, ProbeSpec) else None
            label = label or first.label
            args = ", ".join(f"{a.name}={a.expression}" for a in group.code.args) or "no arguments"
            image = build_record_program(
                group.code,
                action,
                regs,
                name=f"probescope_{number}",
                sleepable=sleepable and mode == "multi",
                clock=self.options.clock,
                expected_attach_type=AttachType.TRACE_UPROBE_MULTI
                if mode == "multi"
                else AttachType.NONE,
            )
            self._group_programs.append(self._owned.load(image, f"{label} ({args})"))
            for index, _probe in group.members:
                self._decoder.add(
                    index,
                    plan.event_types[index],
                    is_return=group.is_return,
                    layout=image.layout,
                )

    def _load_tracepoints(
        self, planned: list[tuple[int, TracepointCode, int]], maps: SharedMaps
    ) -> list[tuple[int, int, str]]:
        loaded = []
        for index, code, event_id in planned:
            assert self._scratch_fd is not None
            label = f"{code.system}:{code.event}"
            image = build_tracepoint_program(
                code,
                maps,
                self._scratch_fd,
                self._claim_offset,
                index=index,
                name=f"ps_tp_{index}",
                clock=self.options.clock,
            )
            fd = self._owned.load(image, label)
            event_type, fields = tracepoint_event_type(code.format, code.system)
            self._decoder.add(
                index,
                event_type,
                is_return=False,
                args=compile_tracepoint_decoder(fields),
            )
            loaded.append((fd, event_id, label))
        return loaded

    def _filter_pids(self, pids_fd: int | None, target: Target) -> None:
        if pids_fd is None:
            return
        pid_map = next(m for m in self._owned.maps if m.fd == pids_fd)
        self._owned.follow_pids(
            pid_map, self._pids, children=target.follow_children, notes=self._stats.notes
        )

    def _attach_uprobes(self, plan: UprobePlan, mode: str) -> None:
        for group, program_fd in zip(plan.groups, self._group_programs, strict=True):
            self._owned.attach_uprobes(
                program_fd, group.members, return_probe=group.is_return, mode=mode
            )

    # -- events ---------------------------------------------------------------------------

    def _start_stream(self) -> None:
        """Fork the recorder now, while the session holds no program, link or command gate
        it would have to close."""
        assert self._owned.ring is not None
        self._stream = EventStream(
            self._owned.ring,
            self._decoder,
            clock=self.options.clock,
            interval=self.interval,
            losses=self._new_losses,
            target_ended=self._target_ended,
            on_target_end=self._release_attachments,
        )
        self._stream.start()

    def events(self) -> Iterator[Event | EventBatch]:
        if self._stream is None and self._aggregator is not None:
            yield from self._aggregating()
            return
        stream = self._stream
        if stream is None:
            raise ProbescopeError("the bpf engine is not attached")
        for batch in stream.events():
            if self._detached:
                return
            yield batch

    def _aggregating(self) -> Iterator[EventBatch]:
        """While the kernel aggregates: an empty batch every read interval (the session's
        pace), until the target ends; the values stay in the maps until detach."""
        pause = self.options.read_interval or self.interval
        while not self._detached:
            if self._target_ended():
                self._owned.release_trackers()
                return
            yield EventBatch([])
            time.sleep(pause)

    def read_aggregation(self, *, clear: bool = False, final: bool = False) -> KernelValues:
        """The in-kernel values so far (`engines.aggregation.AggregatingEngine`)."""
        if self._aggregator is None or self._detached:
            raise ProbescopeError("the bpf engine is not aggregating")
        return self._aggregator.read(clear=clear, final=final)

    def _new_losses(self) -> int:
        if self._counters is None:
            return 0
        total = _u64(self._counters.get(COUNTER_LOST))
        lost = total - self._lost_seen
        self._lost_seen = total
        return lost

    def _target_ended(self) -> bool:
        command = self._command
        if command is not None:
            return command.poll() is not None
        if self._pids:
            return not any(_running(pid) for pid in self._pids)
        return False

    # -- teardown -------------------------------------------------------------------------

    def _release_attachments(self) -> None:
        """The target has ended, and the session with it: detach every probe and the fork/exit
        tracker now, their grace periods (~0.1 s) overlapping the last drain of the ring."""
        self._owned.release_probes()

    def stats(self) -> EngineStats:
        if self._command is not None and self._command.returncode is not None:
            self._stats.command_status = self._command.returncode
        if self._aggregator is not None and not self._detached:
            with contextlib.suppress(BpfError):
                self._stats.extra.update(self._aggregator.totals())
        if self._counters is not None and self._counters.fd >= 0:
            with contextlib.suppress(BpfError):
                self._stats.lost = _u64(self._counters.get(COUNTER_LOST))
                self._stats.extra["filtered"] = _u64(self._counters.get(COUNTER_FILTERED))
        return self._stats

    def detach(self) -> None:
        """Close every link, perf event, program and map (links first: that removes the
        breakpoints). Idempotent."""
        if self._detached:
            return
        self.stats()
        self._detached = True
        self._owned.detach_probes()
        if self._stream is not None:
            self._stream.close(self._stats)
        self._owned.close()
        if self._command is not None and self._command.poll() is None:
            self._command.terminate()
            self._stats.notes.append(
                f"{self._command.argv[0]} (pid {self._command.pid}) was still running: "
                f"terminated, status {self._command.returncode}"
            )
            self._stats.command_status = self._command.returncode


def _check_instruction_boundaries(probes: Sequence[ResolvedProbe]) -> None:
    """uprobe_multi accepts an offset inside an instruction and the traced program then runs
    corrupted code. Probes the symbols layer checked, resolved to a symbol's first byte, or at
    a USDT note are boundaries; every other offset (a ResolvedProbe built by hand from a raw
    kernel-grammar spec) is decoded again here."""
    from probescope.symbols.insn import check_probe_offset

    errors: list[SpecError] = []
    for probe in probes:
        if probe.boundary_checked or probe.kind is ProbeKind.USDT or probe.on_function_entry:
            continue
        assert probe.path is not None and probe.offset is not None
        try:
            check_probe_offset(probe.path, probe.offset)
        except SymbolError as error:
            text = probe.spec.source if isinstance(probe.spec, ProbeSpec) else None
            errors.append(
                SpecError(
                    f"refusing to probe {probe.path}:{probe.offset:#x}: {error.message}",
                    spec=text or str(probe.spec),
                    hint=error.hint or "probe an instruction boundary",
                )
            )
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)


def _u64(value: bytes) -> int:
    return int(struct.unpack_from("<Q", value)[0])


def _ring_size(buffer_size_kb: int | None) -> int:
    """The ring's bytes: `--buffer-size` per CPU times the CPUs (the tracefs meaning), as a
    power of two; 32 MiB by default (half a second of a million 64-byte records a second)."""
    if not buffer_size_kb:
        return DEFAULT_RING_BYTES
    wanted = max(buffer_size_kb * 1024 * (os.cpu_count() or 1), os.sysconf("SC_PAGE_SIZE"))
    return 1 << (wanted - 1).bit_length()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
