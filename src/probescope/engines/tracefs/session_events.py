"""The session's own events in tracefs: dynamic probes renamed into the session's group and
defined in one batched write per events file, their filters written to each event's `filter`
file, the whole group enabled in one write (and, when the kernel refuses, each refused probe
named), tracepoints enabled with their filters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from probescope.engines.tracefs.dynamic_events import DynamicEvents, EventName
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.static_plan import TracepointPlan
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import SpecError, TracefsError
from probescope.events import EventType
from probescope.language.event_names import first_free
from probescope.language.go_strings import KERNEL_CANNOT, kernel_inexpressible
from probescope.language.kinds import BY_KIND
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe


@dataclass
class SessionSpecs:
    """The probes as the session defines them: `specs` in the session's group, and the
    EventType of each event name (named after the probe's own group and event)."""

    specs: list[ProbeSpec] = field(default_factory=list)
    types: dict[str, EventType] = field(default_factory=dict)


def kernel_refusal(probes: Sequence[ResolvedProbe]) -> str | None:
    """Why some probe's arguments cannot be written to uprobe_events (None when all can)."""
    for probe in probes:
        if isinstance(probe.spec, ProbeSpec):
            for arg in kernel_inexpressible(probe.spec.args):
                return (
                    f"{probe.label}: {arg.name}={arg.expression}: {KERNEL_CANNOT} "
                    "(--engine bpf or --engine ptrace read it)"
                )
    return None


def session_specs(probes: Sequence[ResolvedProbe], group: str) -> SessionSpecs:
    """Every probe renamed into `group`: probes of one event share it; events whose names
    collide are numbered (`language.event_names`: `_1`, `_2`..., within 63 characters)."""
    result = SessionSpecs()
    names: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for probe in probes:
        spec = probe.spec
        if not isinstance(spec, ProbeSpec):
            raise TypeError(f"not a dynamic probe: {spec}")
        key = (spec.group_name, spec.event_name)
        name = names.get(key)
        if name is None:
            name = first_free(spec.event_name, used)
            names[key] = name
            used.add(name)
            result.types[name] = EventType.of_probe(spec, probe.kind, name=name)
        result.specs.append(replace(spec, group=group, event=name))
    return result


def install(
    tracefs: Tracefs, specs: Sequence[ProbeSpec], installed: dict[str, list[EventName]]
) -> None:
    """Define `specs`, one batched write per events file, recording the events of each file
    in `installed` (by events file) as soon as they exist, for the teardown to remove even
    when a later file fails."""
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
        installed[events_file] = sorted(
            {EventName(s.group_name, s.event_name) for s in file_specs},
            key=str,
        )


def event_filters(specs: Sequence[ProbeSpec], expressions: Sequence[str | None]) -> dict[str, str]:
    """The filter of each session event (by event name) from the filter of each of its
    probes (`expressions`, in the order of `specs`): the probes of one event share its
    `filter` file, so they must agree."""
    found: dict[str, str | None] = {}
    for spec, expression in zip(specs, expressions, strict=True):
        name = spec.event_name
        if name in found and found[name] != expression:
            text = spec.source or spec.definition()
            raise SpecError(
                f"the probes of event {name!r} have different filters "
                f"({found[name]!r} and {expression!r})",
                spec=text,
                column=text.rfind(expression) if expression and expression in text else None,
                hint="they share the event's one filter file: give them the same filter, "
                "or different event names (p:GROUP/NAME ...)",
            )
        found[name] = expression
    return {name: expression for name, expression in found.items() if expression}


def set_event_filters(instance: Instance, group: str, filters: dict[str, str]) -> None:
    """Write each event's filter (the kernel's error_log says why one is refused)."""
    for event, expression in filters.items():
        instance.clear_error_log()
        try:
            instance.set_filter(group, event, expression)
        except TracefsError as error:
            entries = instance.error_log()
            reason = entries[-1].message if entries else error.message
            raise TracefsError(
                f"the kernel refused the filter of {event}: {reason}",
                command=entries[-1].command if entries else expression,
                column=entries[-1].column if entries else None,
            ) from None


def enable_group(instance: Instance, group: str, specs: Sequence[ProbeSpec]) -> None:
    """Enable the whole group in one write; if the kernel refuses, find each probe it
    refuses (bad instruction, offset past the file) and say which."""
    try:
        instance.enable_group(group)
        return
    except TracefsError as error:
        first_error = error
    instance.enable_group(group, on=False)
    refused = []
    for spec in specs:
        try:
            instance.enable_event(group, spec.event_name)
            instance.enable_event(group, spec.event_name, on=False)
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


def enable_tracepoints(instance: Instance, plans: Sequence[TracepointPlan]) -> None:
    """Set each tracepoint's filter (the kernel's error_log says why one is refused), then
    enable it."""
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
