"""The formats of a session's events, read from its instance once the events exist, and the
decoder built from them: the per-session facts the engine gives on (`TracefsEngine.
event_formats()`), beside the EventType of each event, which carries its format to the sinks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.static_plan import TracepointPlan
from probescope.events import EventType
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.format import EventFormat, parse_event_format, parse_header_page
from probescope.traceevent.ringbuffer import SubBufferLayout


def session_decoder(
    instance: Instance,
    specs: Sequence[ProbeSpec],
    types: Mapping[str, EventType],
    tracepoints: Sequence[TracepointPlan],
    *,
    functions: bool,
    function_stack: bool,
    user_stacks: bool = False,
    kernel_stacks: bool = False,
) -> EventDecoder:
    """A decoder of the instance's sub-buffers that knows every event the session enabled:
    its dynamic probes (typed by their specs, carrying `types[name]`), its tracepoints, the
    user_stack records `userstacktrace` adds with `user_stacks`, the kernel_stack records
    `stacktrace` adds with `kernel_stacks`, and, with `functions`, ftrace's function records
    (and kernel_stack with `function_stack`)."""
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
        decoder.add_event(event_format, probe=spec, event_type=types[spec.event_name])
    for plan in tracepoints:
        decoder.add_event(plan.format, kind=ProbeKind.TRACEPOINT, group=plan.system)
    if user_stacks:
        decoder.add_event(
            open_tail(instance, "user_stack", "caller"),
            kind=ProbeKind.FUNCTION,
            group="ftrace",
        )
    if functions:
        function_format = parse_event_format(
            instance.read("events/ftrace/function/format"), system="ftrace"
        )
        decoder.add_event(function_format, kind=ProbeKind.FUNCTION, group="ftrace")
    if kernel_stacks or (functions and function_stack):
        decoder.add_event(
            open_tail(instance, "kernel_stack", "caller"),
            kind=ProbeKind.FUNCTION,
            group="ftrace",
        )
    return decoder


def open_tail(instance: Instance, event: str, field_name: str) -> EventFormat:
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
