"""An aggregation run inside the kernel by the bpf engine: what it refuses, the maps and
programs it loads, and the reads that hand its values to user space.

Probes with the same key code share a program (one uprobe_multi link per binary, the probe
index as cookie); a tracepoint gets a program of its own. The programs are not sleepable: the
kernel gives sleepable programs no per-CPU hash or stack-trace maps. So an argument read from
a page the process has not touched yet reads as 0 here, where the record engine's sleepable
programs fault it in (numbers a function was just given are rarely on such a page).

Values sit in per-CPU hash maps, read unsummed (`KernelValues`) so that they merge like any
other values. With intervals the value maps come in two generations (see
`aggregation_program`): a read switches the generation, waits until no program still writes
the old one, reads it and empties it.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from probescope.engines.aggregation import KINDS, KernelAggregation, KernelEntry, KernelValues
from probescope.engines.bpf.abi import AttachType, ProgramType
from probescope.engines.bpf.aggregation_keys import KeyLayout, ValueLayout, as_typed
from probescope.engines.bpf.aggregation_program import (
    COUNTERS,
    AggregationMaps,
    HitCode,
    KeyCode,
    Loaded,
    build_hit_program,
)
from probescope.engines.bpf.attachments import Attachments
from probescope.engines.bpf.fetch import check_expressible
from probescope.engines.bpf.latency_program import (
    DEPTH,
    build_entry_program,
    build_return_program,
    thread_value_size,
)
from probescope.engines.bpf.maps import (
    ArrayMap,
    HashMap,
    PercpuArrayMap,
    PercpuHashMap,
    StackTraceMap,
)
from probescope.engines.bpf.plan import plan_uprobes
from probescope.engines.bpf.program import ProgramImage
from probescope.engines.bpf.regs import PtRegs
from probescope.engines.bpf.tracepoints import TracepointCode, tracepoint_event_type
from probescope.errors import BpfError
from probescope.events import EventType
from probescope.language.model import FetchArg, FileOffset, ProbeKind, ProbeSpec, innermost
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import TracepointSpec
from probescope.symbols.insn import starts_frame_setup
from probescope.traceevent.format import EventFormat

MAX_KEYS = 1 << 16
"""Keys per value map (allocated as they come)."""
STACK_DEPTH = 64
STACKS = 1 << 14
MAX_BUCKETS = 1024
DRAIN_WAIT_SECONDS = 1.0
_KINDS = frozenset({ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.USDT, ProbeKind.TRACEPOINT})
_INT_SIZES = (1, 2, 4, 8)


def aggregation_refusal(
    aggregation: KernelAggregation,
    probes: Sequence[ResolvedProbe],
    *,
    default_filter: str | None = None,
) -> str | None:
    """Why these probes cannot be aggregated in the kernel (None when they can)."""
    if aggregation.kind not in KINDS:
        return f"there is no in-kernel {aggregation.kind!r}"
    if default_filter:
        return "--filter runs on records, and in-kernel aggregation writes none"
    if aggregation.buckets > MAX_BUCKETS:
        return f"{aggregation.buckets} histogram buckets (at most {MAX_BUCKETS} in the kernel)"
    try:
        KeyLayout.of(aggregation.fields)
    except BpfError as error:
        return error.message
    names = [f for f in aggregation.fields if f not in _BUILTINS or f == "retval"]
    if aggregation.of is not None:
        names.append(aggregation.of)
    signs: set[bool] = set()
    for probe in probes:
        spec = probe.spec
        if probe.kind not in _KINDS:
            return f"{probe.kind.value} probes"
        if isinstance(spec, TracepointSpec):
            if spec.filter:
                return f"{spec.system}:{spec.event} has a filter, which runs on records"
            if aggregation.kind == "latency":
                return "latency of a tracepoint"
            continue
        if not isinstance(spec, ProbeSpec):
            return f"{probe.label}: not a probe"
        if "kstack" in aggregation.fields:
            return "kernel stacks of user-space probes (a program there sees user registers)"
        if spec.filter:
            return f"{spec.source or probe.label} has a filter, which runs on records"
        for arg in spec.args:
            if arg.name != aggregation.retval and arg.name not in names:
                continue
            if arg.type.is_string or arg.type.count:
                return f"argument {arg.name} ({arg.type}) is not a number"
            if isinstance(innermost(arg.fetch), FileOffset):
                return f"argument {arg.name}: @+OFFSET is not read by aggregation programs"
            reason = check_expressible(arg.fetch, arg.type, is_return=probe.kind.is_return)
            if reason:
                return f"argument {arg.name}: {reason}"
            if arg.name == aggregation.of:
                signs.add(arg.type.signed)
    if len(signs) > 1:
        return f"{aggregation.of} is signed in one probe and unsigned in another"
    return None


_BUILTINS = ("probe", "comm", "pid", "tid", "cpu", "retval", "ustack", "kstack")


@dataclass(frozen=True)
class _Shape:
    """Probes whose programs compute the same: they share one."""

    loads: tuple[tuple[str, FetchArg], ...]
    of: FetchArg | None
    is_return: bool
    return_address: bool


@dataclass(frozen=True)
class _Number:
    size: int
    signed: bool


class KernelAggregator:
    """The maps and programs of one in-kernel aggregation, and its reads."""

    def __init__(
        self,
        aggregation: KernelAggregation,
        owned: Attachments,
        regs: PtRegs,
    ) -> None:
        self.aggregation = aggregation
        self.owned = owned
        self.regs = regs
        self.keys = KeyLayout.of(aggregation.fields)
        self.event_types: dict[int, EventType] = {}
        self.numbers: dict[int, dict[str, _Number]] = {}  # probe index -> key field -> type
        self.at_entry: set[int] = set()  # user stacks of probes at a function's first byte
        self.walk_adds_caller: set[int] = set()  # ... where the kernel may add [sp] itself
        self._groups: list[tuple[int, list[tuple[int, ResolvedProbe]], bool]] = []
        self._stack_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._counted = [0] * len(COUNTERS)
        self._generation = 0

    # -- loading ----------------------------------------------------------------------------

    def load(
        self,
        uprobes: Sequence[ResolvedProbe],
        tracepoints: Sequence[tuple[int, TracepointCode, int]],
        *,
        system_wide: bool,
    ) -> tuple[list[tuple[int, int, str]], HashMap | None]:
        """Create the maps and load every program. Returns the tracepoint programs to attach
        (fd, event id, label) and the pid map to fill (None system-wide)."""
        aggregation = self.aggregation
        plan = plan_uprobes(uprobes, None)
        self.event_types.update(plan.event_types)
        signed = self._of_signed(uprobes, tracepoints)
        self.values = ValueLayout.of(aggregation, signed)
        pid_map = None if system_wide else self.owned.own(HashMap("probescope_pid", 4, 8, 1 << 16))
        self.maps = self._create_maps(pid_map)
        shapes: dict[_Shape, list[tuple[int, ResolvedProbe]]] = {}
        for index, probe in enumerate(uprobes):
            shape = self._shape(index, probe)
            shapes.setdefault(shape, []).append((index, probe))
        for number, (shape, members) in enumerate(shapes.items()):
            image = self._program(shape, f"probescope_a{number}")
            first = members[0][1]
            label = first.spec.source if isinstance(first.spec, ProbeSpec) else None
            fd = self.owned.load(image, label or first.label)
            self._groups.append((fd, members, shape.is_return))
        loaded = [
            (self._load_tracepoint(index, code), event_id, f"{code.system}:{code.event}")
            for index, code, event_id in tracepoints
        ]
        return loaded, pid_map

    def _shape(self, index: int, probe: ResolvedProbe) -> _Shape:
        """What the program of this probe computes; records the types of its key parts."""
        aggregation = self.aggregation
        spec = probe.spec
        assert isinstance(spec, ProbeSpec)
        args = {a.name: a for a in spec.args}
        loads = {n: args[n] for n in aggregation.fields if n in args and n not in _BUILTINS}
        if "retval" in aggregation.fields and aggregation.retval in args:
            loads["retval"] = args[aggregation.retval]
        self.numbers[index] = {
            name: _Number(arg.type.size, arg.type.signed) for name, arg in loads.items()
        }
        of = args.get(aggregation.of) if aggregation.of else None
        entry = probe.on_function_entry and not probe.kind.is_return
        if entry and "ustack" in aggregation.fields:
            self.at_entry.add(index)
            if probe.path and starts_frame_setup(probe.path, probe.offset or 0):
                self.walk_adds_caller.add(index)
        return _Shape(
            tuple(sorted(loads.items())),
            of,
            probe.kind.is_return,
            entry and "ustack" in aggregation.fields,
        )

    def _program(self, shape: _Shape, name: str) -> ProgramImage:
        aggregation = self.aggregation
        key = KeyCode(
            self.keys,
            {n: Loaded.of_fetch(arg) for n, arg in shape.loads},
            return_address=shape.return_address,
        )
        if aggregation.kind == "latency":
            if shape.is_return:
                return build_return_program(
                    key,
                    aggregation,
                    self.values,
                    self.maps,
                    self.regs,
                    name=name,
                )
            return build_entry_program(key, self.maps, self.regs, name=name)
        of = Loaded.of_fetch(shape.of) if shape.of is not None else None
        return build_hit_program(
            HitCode(key, of),
            aggregation,
            self.values,
            self.maps,
            self.regs,
            name=name,
            is_return=shape.is_return,
        )

    def _load_tracepoint(self, index: int, code: TracepointCode) -> int:
        event_type, _ = tracepoint_event_type(code.format, code.system)
        self.event_types[index] = event_type
        loads = {}
        for name in (*self.aggregation.fields, self.aggregation.of):
            if name is None or name in _BUILTINS or not code.format.has_field(name):
                continue
            found = code.format.field(name)
            if found.is_array or found.is_dynamic or found.size not in _INT_SIZES:
                raise BpfError(f"{code.system}:{code.event} field {name} is not a number")
            if found.offset < 8 or found.offset % found.size:
                raise BpfError(f"{code.system}:{code.event} field {name} is not aligned")
            loads[name] = Loaded(None, found.offset, found.size, found.signed)
        self.numbers[index] = {
            n: _Number(lo.size, lo.signed)
            for n, lo in loads.items()
            if n in self.aggregation.fields
        }
        of = loads.get(self.aggregation.of) if self.aggregation.of else None
        key_loads = {n: lo for n, lo in loads.items() if n in self.aggregation.fields}
        hit = HitCode(KeyCode(self.keys, key_loads, probe_index=index), of)
        image = build_hit_program(
            hit,
            self.aggregation,
            self.values,
            self.maps,
            self.regs,
            name=f"ps_tpa_{index}",
            program_type=ProgramType.TRACEPOINT,
            expected_attach_type=AttachType.NONE,
        )
        return self.owned.load(image, f"{code.system}:{code.event}")

    def _of_signed(
        self,
        uprobes: Sequence[ResolvedProbe],
        tracepoints: Sequence[tuple[int, TracepointCode, int]],
    ) -> bool:
        of = self.aggregation.of
        for probe in uprobes:
            assert isinstance(probe.spec, ProbeSpec)
            for arg in probe.spec.args:
                if arg.name == of:
                    return arg.type.signed
        for _, code, _ in tracepoints:
            fmt: EventFormat = code.format
            if of is not None and fmt.has_field(of):
                return fmt.field(of).signed
        return False

    def _create_maps(self, pid_map: HashMap | None) -> AggregationMaps:
        aggregation, own = self.aggregation, self.owned.own
        generations = 2 if aggregation.intervals else 1
        self.value_maps = [
            own(PercpuHashMap(f"probescope_v{g}", self.keys.size, self.values.size, MAX_KEYS))
            for g in range(generations)
        ]
        self.counters = own(PercpuArrayMap("probescope_ac", 8, len(COUNTERS)))
        template = None
        if self.values.buckets:  # zeros to insert a new key's value from (too big to build)
            template = own(ArrayMap("probescope_vt", self.values.size, 1))
        self.user_stacks: StackTraceMap | None = None
        self.kernel_stacks: StackTraceMap | None = None
        if "ustack" in aggregation.fields:
            self.user_stacks = own(StackTraceMap("probescope_us", STACK_DEPTH, STACKS))
        if "kstack" in aggregation.fields:
            self.kernel_stacks = own(StackTraceMap("probescope_ks", STACK_DEPTH, STACKS))
        self.generation: ArrayMap | None = None
        self.inflight: PercpuArrayMap | None = None
        if generations > 1:
            self.generation = own(ArrayMap("probescope_gen", 8, 1))
            self.inflight = own(PercpuArrayMap("probescope_inf", 8, 2))
        self.threads: HashMap | None = None
        thread_template = None
        if aggregation.kind == "latency":
            size = thread_value_size(self.keys)
            self.threads = own(HashMap("probescope_thr", 4, size, MAX_KEYS))
            thread_template = own(ArrayMap("probescope_tt", size, 1))
        return AggregationMaps(
            values=tuple(m.fd for m in self.value_maps),
            counters=self.counters.fd,
            template=template.fd if template else None,
            pids=pid_map.fd if pid_map else None,
            user_stacks=self.user_stacks.fd if self.user_stacks else None,
            kernel_stacks=self.kernel_stacks.fd if self.kernel_stacks else None,
            generation=self.generation.fd if self.generation else None,
            inflight=self.inflight.fd if self.inflight else None,
            threads=self.threads.fd if self.threads else None,
            thread_template=thread_template.fd if thread_template else None,
        )

    def attach_uprobes(self, mode: str) -> None:
        for fd, members, is_return in self._groups:
            self.owned.attach_uprobes(fd, members, return_probe=is_return, mode=mode)

    # -- reading ----------------------------------------------------------------------------

    def read(self, *, clear: bool = False, final: bool = False) -> KernelValues:
        """The values (of the generation just ended, with `clear`), and the counters since
        the last clearing read."""
        if clear and self.generation is None:
            raise BpfError("this aggregation was loaded without intervals: it cannot be cleared")
        value_map = self.value_maps[0]
        if clear:
            value_map = self._switch_generation()
        pairs = list(value_map.per_cpu_items())
        if clear:
            for key, _ in pairs:
                value_map.delete(key)
        result = KernelValues(event_types=dict(self.event_types))
        result.entries = [self._entry(key, values) for key, values in pairs]
        totals = [self.counters.sum_u64(i) for i in range(len(COUNTERS))]
        result.counters = {
            name: total - seen
            for name, total, seen in zip(COUNTERS, totals, self._counted, strict=True)
            if total - seen
        }
        if clear:
            self._counted = totals
        if final and self.threads is not None:
            still_open = sum(
                min(struct.unpack_from("<Q", value)[0], DEPTH) for _, value in self.threads.items()
            )
            if still_open:
                result.counters["open"] = still_open
        return result

    def totals(self) -> dict[str, int]:
        """Every counter since attach (what could not be counted), for the engine's stats."""
        totals = (self.counters.sum_u64(i) for i in range(len(COUNTERS)))
        return {name: total for name, total in zip(COUNTERS, totals, strict=True) if total}

    def _switch_generation(self) -> PercpuHashMap:
        assert self.generation is not None and self.inflight is not None
        old = self._generation
        self._generation ^= 1
        self.generation.set(0, struct.pack("<Q", self._generation))
        deadline = time.monotonic() + DRAIN_WAIT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.001)
            if all(struct.unpack_from("<q", v)[0] == 0 for v in self.inflight.per_cpu(old)):
                break
        return self.value_maps[old]

    def _entry(self, key: bytes, values: list[bytes]) -> KernelEntry:
        probe, pid, raw = self.keys.read(key)
        numbers = self.numbers.get(probe, {})
        parts: list[object] = []
        for name in self.aggregation.fields:
            if name == "probe":
                parts.append(probe)
            elif name == "pid":
                parts.append(pid)
            elif name in ("tid", "cpu", "comm"):
                parts.append(raw[name])
            elif name == "ustack":
                pair = raw[name]
                assert isinstance(pair, tuple)
                stack_id, caller = pair
                frames = self._stack(self.user_stacks, stack_id)
                if caller and frames and probe in self.at_entry:
                    frames = self._with_caller(probe, frames, caller)
                parts.append(frames)
            elif name == "kstack":
                parts.append(self._stack(self.kernel_stacks, raw[name]))  # type: ignore[arg-type]
            else:
                number = numbers.get(name)
                value = raw[name]
                assert isinstance(value, int)
                parts.append(
                    None if number is None else as_typed(value, number.size, number.signed)
                )
        per_cpu = tuple(self.values.read(value) for value in values)
        return KernelEntry(probe, tuple(parts), pid, per_cpu)

    def _with_caller(self, probe: int, frames: tuple[int, ...], caller: int) -> tuple[int, ...]:
        """A stack taken at a function's first instruction, with its caller: the frame
        pointers still describe the caller's frame, so a walk skips the return address at
        [sp] — unless the kernel added it (it does at `push %rbp` and `endbr64`)."""
        if probe in self.walk_adds_caller and frames[1:2] == (caller,):
            return frames
        return (frames[0], caller, *frames[1:])

    def _stack(self, stacks: StackTraceMap | None, stack_id: int) -> tuple[int, ...]:
        if stacks is None or stack_id < 0:
            return ()
        cached = self._stack_cache.get((stacks.fd, stack_id))
        if cached is None:
            cached = self._stack_cache[(stacks.fd, stack_id)] = stacks.stack(stack_id)
        return cached
