"""Plan the static events of a session before anything is enabled: expand tracepoint globs
against the kernel's event list, check filters against each event's fields, and check that
function-tracer patterns select something (and not everything, unless asked)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from probescope.engines.tracefs.filters import check_filter
from probescope.engines.tracefs.ownership import PREFIX
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import SpecError, SpecErrors, TracefsError
from probescope.language.static_events import FunctionSpec, TracepointSpec
from probescope.traceevent.format import EventFormat, parse_event_format

# Events that exist only to describe ftrace's own records; they cannot be enabled.
NOT_ENABLEABLE_SYSTEMS = frozenset({"ftrace"})


@dataclass(frozen=True)
class TracepointPlan:
    system: str
    event: str
    filter: str | None
    format: EventFormat


def list_tracepoints(tracefs: Tracefs) -> list[tuple[str, str]]:
    """(system, event) of every enableable trace event, probescope's own groups left out."""
    found = []
    for system in tracefs.list_dir("events"):
        if system in NOT_ENABLEABLE_SYSTEMS or system.startswith(PREFIX):
            continue
        for event in tracefs.list_dir(f"events/{system}"):
            if tracefs.exists(f"events/{system}/{event}/format"):
                found.append((system, event))
    return found


def read_format(tracefs: Tracefs, system: str, event: str) -> EventFormat:
    return parse_event_format(tracefs.read(f"events/{system}/{event}/format"), system=system)


def plan_tracepoints(
    tracefs: Tracefs, specs: Sequence[TracepointSpec], default_filter: str | None = None
) -> list[TracepointPlan]:
    """Every (system, event) the specs select, with its checked filter; SpecErrors lists
    unknown tracepoints and bad filters of all specs together."""
    available = list_tracepoints(tracefs)
    plans: dict[tuple[str, str], TracepointPlan] = {}
    errors: list[SpecError] = []
    for spec in specs:
        text = spec.source or str(spec)
        matches = [
            (system, event)
            for system, event in available
            if fnmatch.fnmatchcase(system, spec.system) and fnmatch.fnmatchcase(event, spec.event)
        ]
        if not matches:
            errors.append(_unknown(spec, text, available))
            continue
        expression = spec.filter or default_filter
        for system, event in matches:
            event_format = read_format(tracefs, system, event)
            if expression:
                column = text.find(expression) if spec.filter else None
                try:
                    check_filter(
                        expression,
                        event_format,
                        spec=text if spec.filter else expression,
                        column=column if column is not None else 0,
                    )
                except SpecError as error:
                    errors.append(error)
                    continue
            plans[(system, event)] = TracepointPlan(system, event, expression, event_format)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return list(plans.values())


def _unknown(spec: TracepointSpec, text: str, available: list[tuple[str, str]]) -> SpecError:
    systems = sorted({system for system, _ in available})
    if not any(fnmatch.fnmatchcase(s, spec.system) for s in systems):
        close = fnmatch.filter(systems, f"*{spec.system.strip('*')}*")[:8]
        return SpecError(
            f"no tracepoint system matches {spec.system!r}",
            spec=text,
            column=text.find(spec.system),
            hint=("similar: " + ", ".join(close))
            if close
            else "list them with `probescope list tracepoints`",
        )
    events = sorted(e for s, e in available if fnmatch.fnmatchcase(s, spec.system))
    close = [e for e in events if spec.event.strip("*") in e][:8]
    return SpecError(
        f"no tracepoint {spec.system}:{spec.event}",
        spec=text,
        column=text.rfind(spec.event),
        hint=("similar: " + ", ".join(close))
        if close
        else f"list them with `probescope list tracepoints '{spec.system}:*'`",
    )


def available_functions(tracefs: Tracefs) -> list[str]:
    """`available_filter_functions`, one `name` or `name [module]` per entry."""
    try:
        text = tracefs.read("available_filter_functions")
    except TracefsError as error:
        raise TracefsError(
            "the kernel refuses the function tracer here: " + error.message,
            hint="this kernel forbids ftrace function tracing (lockdown, or a hypervisor "
            "policy); use tracepoints or uprobes, or run on another kernel",
            path=error.path,
        ) from None
    return text.splitlines()


def check_functions(
    tracefs: Tracefs, specs: Sequence[FunctionSpec], *, allow_all: bool
) -> dict[FunctionSpec, int]:
    """How many kernel functions each pattern selects; refuses empty selections and, without
    `allow_all`, patterns that select everything."""
    if not specs:
        return {}
    functions = available_functions(tracefs)
    counts: dict[FunctionSpec, int] = {}
    errors: list[SpecError] = []
    if all(spec.exclude for spec in specs) and not allow_all:
        first = specs[0]
        text = first.source or str(first)
        raise SpecError(
            "only excluded functions given: every other kernel function would be traced",
            spec=text,
            column=text.find(first.pattern),
            hint="add the functions to trace (f:vfs_*), or pass --all if you mean it",
        )
    for spec in specs:
        text = spec.source or str(spec)
        column = text.find(spec.pattern)
        if spec.traces_everything and not allow_all and not spec.exclude:
            errors.append(
                SpecError(
                    f"{spec.pattern!r} traces all {len(functions)} kernel functions",
                    spec=text,
                    column=column,
                    hint="that slows the whole machine down several times over; "
                    "narrow the pattern, or pass --all if you mean it",
                )
            )
            continue
        count = _count_matches(functions, spec.pattern)
        if count == 0:
            errors.append(
                SpecError(
                    f"no kernel function matches {spec.pattern!r}",
                    spec=text,
                    column=column,
                    hint=f"list them with `probescope list functions '{spec.pattern}'`",
                )
            )
            continue
        counts[spec] = count
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return counts


def _count_matches(functions: list[str], pattern: str) -> int:
    glob, _, module = pattern.partition(":mod:")
    glob = glob or "*"
    name_matches = re.compile(fnmatch.translate(glob)).match
    module_matches = re.compile(fnmatch.translate(module)).match if module else None
    count = 0
    for entry in functions:
        name, _, rest = entry.partition(" ")
        if module_matches is not None and not module_matches(rest.strip("[] ")):
            continue
        if name_matches(name):
            count += 1
    return count
