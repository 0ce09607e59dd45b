"""What a session's probes become before anything is loaded: one EventType per event name (as
the tracefs engine names them), probes grouped by the code they need (one program per group,
one link per binary of a group), filters checked against each probe's fields. Every problem
of every probe is collected before failing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from probescope.engines.bpf.fetch import Unsupported
from probescope.engines.bpf.filter_compile import (
    FieldPlace,
    FixedString,
    LocatedString,
    NumberField,
    filter_emitter,
    plan_filter,
)
from probescope.engines.bpf.program import ProbeCode
from probescope.engines.bpf.record import (
    COMM_SIZE,
    HEADER_SIZE,
    OFF_COMM,
    OFF_CPU,
    OFF_IP,
    OFF_PID_TGID,
    OFF_RET_IP,
    RecordLayout,
    layout_for,
)
from probescope.engines.bpf.strings import ScratchLayout
from probescope.engines.bpf.tracepoints import TRACEPOINT_SCRATCH_SIZE, TracepointCode
from probescope.errors import BpfError, SpecError, SpecErrors
from probescope.events import EventType
from probescope.language.event_names import first_free
from probescope.language.filter_grammar import parse_filter
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.traceevent.format import EventFormat

SPECIAL_FIELDS: dict[str, FieldPlace] = {
    "comm": FixedString(OFF_COMM, COMM_SIZE),
    "COMM": FixedString(OFF_COMM, COMM_SIZE),
    "cpu": NumberField(OFF_CPU, 4, False),
    "CPU": NumberField(OFF_CPU, 4, False),
}


@dataclass
class ProbeGroup:
    """Probes that run one program: same arguments, entry or return, filter."""

    code: ProbeCode
    members: list[tuple[int, ResolvedProbe]] = field(default_factory=list)

    @property
    def is_return(self) -> bool:
        return self.code.is_return

    def by_path(self) -> dict[str, list[tuple[int, ResolvedProbe]]]:
        paths: dict[str, list[tuple[int, ResolvedProbe]]] = {}
        for index, probe in self.members:
            assert probe.path is not None
            paths.setdefault(probe.path, []).append((index, probe))
        return paths


@dataclass
class UprobePlan:
    groups: list[ProbeGroup]
    event_types: dict[int, EventType]  # by probe index
    layouts: dict[int, RecordLayout]  # by probe index

    @property
    def scratch_size(self) -> int:
        """The largest scratch value a program of these groups needs (0: none does)."""
        sizes = [
            ScratchLayout.plan(layout_for(group.code.args)).value_size
            for group in self.groups
            if layout_for(group.code.args).has_strings
        ]
        return max(sizes, default=0)


def plan_uprobes(
    probes: Sequence[ResolvedProbe], default_filter: str | None, first_index: int = 0
) -> UprobePlan:
    groups: dict[ProbeCode, ProbeGroup] = {}
    event_types: dict[int, EventType] = {}
    layouts: dict[int, RecordLayout] = {}
    layouts_of: dict[ProbeCode, RecordLayout] = {}
    names: dict[tuple[str, str], EventType] = {}
    used: set[str] = set()
    errors: list[SpecError] = []
    checked: dict[tuple[object, ...], ProbeCode] = {}  # probes that share arguments share work
    for number, probe in enumerate(probes):
        index = first_index + number
        spec = probe.spec
        assert isinstance(spec, ProbeSpec)
        try:
            shared = (spec.args, probe.kind.is_return, spec.filter)
            code = checked.get(shared)
            if code is None or code.probe_offset is not None:
                text = spec.source or spec.definition()
                code = checked[shared] = _probe_code(probe, spec, text, default_filter)
        except SpecErrors as many:
            errors += many.errors
            continue
        except SpecError as error:
            errors.append(error)
            continue
        group = groups.get(code)
        if group is None:
            group = groups[code] = ProbeGroup(code)
            layouts_of[code] = layout_for(code.args)
        group.members.append((index, probe))
        layouts[index] = layouts_of[code]
        key = (spec.group_name, spec.event_name)
        event_type = names.get(key)
        if event_type is None:
            name = first_free(spec.event_name, used)
            used.add(name)
            event_type = names[key] = EventType.of_probe(spec, probe.kind, name=name)
        event_types[index] = event_type
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return UprobePlan(list(groups.values()), event_types, layouts)


def _probe_code(
    probe: ResolvedProbe, spec: ProbeSpec, text: str, default_filter: str | None
) -> ProbeCode:
    assert probe.offset is not None
    is_return = probe.kind.is_return
    code = ProbeCode.of(spec.args, is_return, probe.offset)
    refusal = code.refusal()
    if refusal:
        raise SpecError(
            f"the bpf engine cannot fetch {refusal}",
            spec=text,
            hint="use --engine tracefs for this probe",
        )
    expression = spec.filter or default_filter
    if not expression:
        return code
    column = text.find(expression) if spec.filter and expression in text else None
    where = text if column is not None else expression
    tree = parse_filter(expression, spec=where, column=column or 0)
    layout = layout_for(spec.args)
    scratch = ScratchLayout.plan(layout) if layout.has_strings else None

    def resolve(name: str) -> FieldPlace | None:
        return _uprobe_field(name, layout, scratch, is_return)

    fields = ", ".join([a.name for a in spec.args] + ["common_pid", "comm", "cpu"])
    plans = plan_filter(
        tree, resolve, spec=where, column=column or 0, fields_hint=f"fields: {fields}"
    )
    return ProbeCode.of(spec.args, is_return, probe.offset, expression, filter_emitter(tree, plans))


def _uprobe_field(
    name: str, layout: RecordLayout, scratch: ScratchLayout | None, is_return: bool
) -> FieldPlace | None:
    if name in SPECIAL_FIELDS:
        return SPECIAL_FIELDS[name]
    if name == "common_pid":
        return NumberField(OFF_PID_TGID, 4, True)
    if name in ("__probe_ip", "__probe_func"):
        return NumberField(OFF_IP, 8, False)
    if name == "__probe_ret_ip" and is_return:
        return NumberField(OFF_RET_IP, 8, False)
    for slot in layout.slots:
        if slot.arg.name != name:
            continue
        arg_type = slot.arg.type
        if arg_type.count:
            return None  # arrays cannot be filtered on (neither can the kernel)
        if slot.is_string:
            assert scratch is not None
            return LocatedString(slot.offset, 0, scratch.record_area)
        return NumberField(slot.offset, arg_type.size, arg_type.signed)
    return None


def tracepoint_code(
    system: str, event: str, fmt: EventFormat, expression: str | None, text: str
) -> TracepointCode:
    """A tracepoint's program plan with its filter compiled (fields at their `format` places
    in the copied record)."""
    if not expression:
        return TracepointCode(system, event, fmt)
    column = text.find(expression) if expression in text else None
    where = text if column is not None else expression
    tree = parse_filter(expression, spec=where, column=column or 0)

    def resolve(name: str) -> FieldPlace | None:
        if name in SPECIAL_FIELDS:
            return SPECIAL_FIELDS[name]
        if name == "common_pid":
            return NumberField(OFF_PID_TGID, 4, True)
        if name.startswith("common_") or not fmt.has_field(name):
            return None
        found = fmt.field(name)
        at = HEADER_SIZE + found.offset
        if found.is_dynamic:
            if not found.element_type.endswith("char"):
                return None
            base = HEADER_SIZE + (found.end if found.is_rel_loc else 0)
            return LocatedString(at, base, TRACEPOINT_SCRATCH_SIZE)
        if found.is_array:
            if found.element_type.endswith("char"):
                return FixedString(at, found.size)
            return None
        if found.size in (1, 2, 4, 8):
            return NumberField(at, found.size, found.signed)
        return None

    listing = ", ".join(f.name for f in fmt.fields)
    plans = plan_filter(
        tree, resolve, spec=where, column=column or 0, fields_hint=f"fields: {listing}"
    )
    return TracepointCode(system, event, fmt, expression, filter_emitter(tree, plans))


def check_expressible(probes: Sequence[ResolvedProbe]) -> str | None:
    """Why some probe cannot run on the bpf engine (None when all can): the `auto` choice."""
    for probe in probes:
        spec = probe.spec
        if not isinstance(spec, ProbeSpec) or probe.offset is None:
            continue
        try:
            refusal = ProbeCode.of(spec.args, probe.kind.is_return, probe.offset).refusal()
        except (BpfError, Unsupported) as error:
            refusal = error.message
        if refusal:
            return f"{probe.label}: {refusal}"
    return None
