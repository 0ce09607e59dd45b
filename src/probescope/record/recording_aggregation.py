"""Aggregations of a recording — `probescope count|hist|latency --input FILE`: the events of a
trace.dat, selected by name, aggregated as a live session's events are, offline (no kernel, no
tracefs, no root, no binaries).

With a recording, a SPEC names recorded events, not probes: `NAME` or `SYSTEM:NAME` (a `t:` or
`tracepoint:` prefix is allowed), each part a shell glob (`func_*`, `sched:*`) matched against
an event's name and its system (a tracepoint's subsystem, a probe's group). No SPEC selects
every recorded event. A SPEC that selects none is an error naming the events the file holds.

Keys and values come from the recorded fields: `probe`, `comm`, `pid`, `tid`, `cpu`, the
arguments the recording session fetched (by the names it gave them), and `retval`: the argument
a return probe fetched as `$retval` (or one named `retval`). A latency pairs each recorded entry
with the return of the same function on the same thread by nesting (a recording holds no stack
pointer: `aggregate.latency`), the return event being the one probescope's recording says
probes the same function, else the one named `NAME__return`.

Stacks (`stacks`, `--by ustack|kstack`) come from the kernel's stack records that follow an
event on its CPU: `user_stack` (`probescope record --stack`, trace-cmd's `userstacktrace`) and
`kernel_stack` (function-tracer events with `--stack`, trace-cmd's `stacktrace`), named from
the recording's maps, functions and kallsyms (`record.symbolizer.RecordedFrames`). At a function
entry the kernel's frame-pointer walk misses the caller; `record --stack` records the return
address there (`__ps_ret`), which goes back in as the live `--stack-method fp` puts it.

With an interval, values are handed over per interval of recorded time: the first event's
timestamp starts the first interval, and an interval without events is handed over empty.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from probescope.aggregate.aggregators import (
    KERNEL_STACK_RECORD,
    USER_STACK_RECORD,
    EventAggregator,
    StackOptions,
    is_stack_record,
)
from probescope.aggregate.keys import BUILTIN_FIELDS, STACK_FIELDS, KeyPlan, is_argument_field
from probescope.aggregate.latency import RETURN_VALUE, LatencyAggregator
from probescope.aggregate.maps import Aggregation
from probescope.aggregate.plan import RETURN_SUFFIX, AggregationError, Request
from probescope.aggregate.stack_capture import RETURN_ADDRESS
from probescope.errors import SpecError, SpecErrors
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeKind
from probescope.record.facts import RecordingFacts
from probescope.record.recording import Recording
from probescope.record.symbolizer import RecordedFrames

TRACEPOINT_PREFIXES = ("tracepoint:", "t:")
SPEC_HINT = (
    "with --input a SPEC names recorded events: NAME or SYSTEM:NAME, globs allowed "
    "(e.g. 'func_*', 'sched:*')"
)
STACK_HINTS = {
    "ustack": "record user stacks with the events: probescope record --stack SPEC... -o FILE "
    "(or trace-cmd record -O userstacktrace)",
    "kstack": "record kernel stacks with function-tracer events: probescope record --stack "
    "'f:FUNC' -o FILE (or trace-cmd record -T)",
}
_STACK_RECORDS = {"ustack": USER_STACK_RECORD, "kstack": KERNEL_STACK_RECORD}
_RETVAL_FETCH = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=\$retval\b")
_NOT_A_NAME = re.compile(r"[\s/=+%$(),]")


@dataclass(frozen=True)
class EventPattern:
    """One SPEC given with a recording: globs over an event's system (None: any) and name."""

    text: str
    system: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> EventPattern:
        body = text.strip()
        start = text.index(body) if body else 0
        for prefix in TRACEPOINT_PREFIXES:
            if body.startswith(prefix):
                body, start = body[len(prefix) :], start + len(prefix)
                break
        bad = _NOT_A_NAME.search(body)
        if bad is not None or not body or body.count(":") > 1:
            column = start + (bad.start() if bad else max(body.rfind(":"), 0))
            raise SpecError(
                "with --input a SPEC is the name of a recorded event, not a probe",
                spec=text,
                column=column,
                hint=SPEC_HINT,
            )
        system, _, name = body.rpartition(":")
        if not name:
            raise SpecError("the event name is empty", spec=text, column=len(text), hint=SPEC_HINT)
        return cls(text, system or None, name)

    def matches(self, event_type: EventType) -> bool:
        if not fnmatch.fnmatchcase(event_type.name, self.name):
            return False
        return self.system is None or fnmatch.fnmatchcase(event_type.group, self.system)


def label(event_type: EventType) -> str:
    return f"{event_type.group}:{event_type.name}"


class RecordingAggregation:
    """One aggregation of `request` over the events of `recording`; `run()` returns the values.

    Every check is made before any value is: the event types come from the recording's facts
    (probescope's files), or from reading a trace-cmd file once. `events` counts the events
    aggregated, `lost` what the kernel lost while recording.
    """

    def __init__(self, request: Request, recording: Recording) -> None:
        self.request = request
        self.recording = recording
        self.events = 0
        self.lost = 0
        self._time_span = (0, 0)
        specs = []
        for spec in request.specs:
            if not isinstance(spec, str):
                raise AggregationError(
                    f"a recording's events are selected by name, not by a parsed spec ({spec})",
                    hint=SPEC_HINT,
                )
            specs.append(spec)
        errors: list[SpecError] = []
        self.patterns = []
        for text in specs:
            try:
                self.patterns.append(EventPattern.parse(text))
            except SpecError as error:
                errors.append(error)
        if errors:
            raise errors[0] if len(errors) == 1 else SpecErrors(errors)
        self.recorded = self._recorded_types()
        self.selected = self._select()
        self.returns: dict[str, str] = {}
        if request.kind == "latency":
            self._pair_calls(recording.facts)
        self.fields = self._key_fields()
        self.stack_fields = tuple(f for f in self.fields if f in STACK_FIELDS)
        self._check_stacks()
        self._retvals = _return_value_arguments(recording.facts, self.selected)
        self.of = request.of
        self._check_fields()
        retval_wanted = "retval" in self.fields or self.of == RETURN_VALUE
        self._as_aggregated: dict[EventType, EventType] = {}
        self._retval_index: dict[EventType, int] = {}
        for event_type in self.selected:
            index = self._retvals.get(event_type.name) if retval_wanted else None
            if index is None:
                self._as_aggregated[event_type] = event_type
                continue
            self._retval_index[event_type] = index
            self._as_aggregated[event_type] = replace(
                event_type,
                arg_names=(*event_type.arg_names, RETURN_VALUE),
                arg_types=(*event_type.arg_types, event_type.arg_types[index]),
            )

    # -- what the recording holds ----------------------------------------------------------

    def _recorded_types(self) -> list[EventType]:
        """Every event type of the file but the kernel's stack records, in the file's order."""
        known = self.recording.known_event_types()
        if not known:  # a trace-cmd file: its events are typed as their records are read
            seen: dict[EventType, None] = {}
            for batch in self.recording.batches():
                for event in batch.events:
                    seen.setdefault(event.type)
            known = list(seen)
        return [t for t in known if not is_stack_record(t)]

    def _names(self) -> str:
        names = sorted({_shown(t) for t in self.recorded})
        return ", ".join(names) if names else "no events"

    def _select(self) -> list[EventType]:
        if not self.patterns:
            return list(self.recorded)
        errors = []
        selected = []
        for pattern in self.patterns:
            matched = [t for t in self.recorded if pattern.matches(t)]
            if not matched:
                errors.append(
                    SpecError(
                        f"no recorded event is named {pattern.text!r}",
                        spec=pattern.text,
                        column=0,
                        hint=f"the recording holds {self._names()}; {SPEC_HINT}",
                    )
                )
            selected += [t for t in matched if t not in selected]
        if errors:
            raise errors[0] if len(errors) == 1 else SpecErrors(errors)
        return selected

    def _pair_calls(self, facts: RecordingFacts) -> None:
        """Each selected entry with its recorded return (selected or not); a return selected
        stands for its entry. An entry without a return is an error."""
        by_name = {t.name: t for t in self.recorded}
        probed = _probed_functions(facts)
        entries: list[EventType] = []
        for event_type in self.selected:
            if event_type.kind.is_return:
                entry = _partner(event_type.name, probed, by_name, returning=False)
                if entry is not None and entry not in entries:
                    entries.append(entry)
            elif event_type not in entries:
                entries.append(event_type)
        missing = []
        pairs = []
        for entry in entries:
            returning = _partner(entry.name, probed, by_name, returning=True)
            if returning is None:
                if self.patterns:
                    missing.append(entry.name)
                continue
            self.returns[returning.name] = entry.name
            pairs += [entry, returning]
        if missing or not pairs:
            what = ", ".join(missing) if missing else "no function"
            raise AggregationError(
                f"the recording holds no return events of {what}: latency pairs entries "
                "with returns",
                hint="record both: probescope record 'PROG:FUNC' 'r:PROG:FUNC' -o FILE "
                f"(the recording holds {self._names()})",
            )
        self.selected = pairs

    def _key_fields(self) -> tuple[str, ...]:
        request = self.request
        if request.by is not None:
            return request.by
        if request.kind == "count":
            return ("probe",)
        labels = {label(t) for t in self.selected if t.name not in self.returns}
        several: tuple[str, ...] = ("probe",) if len(labels) > 1 else ()
        if request.kind == "stacks":  # as the live default: user stacks of user probes
            user = any(t.kind.is_user for t in self.selected)
            return (*several, "ustack" if user else "kstack")
        return several

    def _check_stacks(self) -> None:
        """Stacks asked for are in the file: the kernel's records of their kind follow at
        least one selected event (a look through the file, before any value is made)."""
        if not self.stack_fields:
            return
        if self.request.kind == "latency":
            raise AggregationError(
                "a latency is not keyed by stacks from a recording",
                hint="key it by stacks live: probescope latency FUNC --by ustack -c CMD",
            )
        wanted = {_STACK_RECORDS[f] for f in self.stack_fields}
        found = self._stack_records_after(set(self.selected), wanted)
        missing = [f for f in self.stack_fields if _STACK_RECORDS[f] not in found]
        if missing:
            kind = "user" if missing[0] == "ustack" else "kernel"
            raise AggregationError(
                f"the recording holds no {kind} stacks of the events selected "
                f"({', '.join(sorted({label(t) for t in self.selected}))})",
                hint=STACK_HINTS[missing[0]],
            )

    def _stack_records_after(self, selected: set[EventType], wanted: set[str]) -> set[str]:
        """Which of the stack records `wanted` follow a selected event on its CPU."""
        found: set[str] = set()
        follows: dict[int, bool] = {}
        for batch in self.recording.batches():
            for event in batch.events:
                event_type = event.type
                if is_stack_record(event_type):
                    if follows.get(event.cpu) and event_type.name in wanted:
                        found.add(event_type.name)
                        if found == wanted:
                            return found
                else:
                    follows[event.cpu] = event_type in selected
        return found

    def _check_fields(self) -> None:
        """Every argument key and the histogram's argument held by a selected event."""
        names = {n for t in self.selected for n in t.arg_names}
        missing = [f for f in self.fields if is_argument_field(f) and f not in names]
        if "retval" in self.fields and not self._retvals:
            missing.append("retval")
        if self.of is not None and self.of not in names:
            if self.of == "retval" and self._retvals:
                self.of = RETURN_VALUE
            else:
                missing.append(self.of)
        if missing:
            held = ", ".join(sorted(names)) or "none"
            raise AggregationError(
                f"no selected event of the recording has an argument named {missing[0]!r}",
                hint=f"keys are {', '.join(f for f in BUILTIN_FIELDS if f not in STACK_FIELDS)}"
                f" or an argument the recording session fetched (here: {held}); retval is "
                "a return probe's $retval argument",
            )

    # -- running -----------------------------------------------------------------------------

    def run(
        self,
        *,
        interval: float | None = None,
        on_interval: Callable[[Aggregation], None] | None = None,
    ) -> Aggregation:
        """Aggregate every selected event of the recording; the values (with `interval`, those
        of the last interval, `on_interval` having been given each one before it)."""
        aggregator = self._aggregator()
        batches = self._batches()
        if interval is None:
            for batch in batches:
                aggregator.add_batch(batch)
            values = _values(aggregator, final=True)
            values.started_ns, values.ended_ns = self._time_span
            return values
        step = max(round(interval * 1e9), 1)
        started = 0
        for item in recorded_intervals(batches, step):
            if isinstance(item, EventBatch):
                aggregator.add_batch(item)
                continue
            values = _values(aggregator, final=False)
            values.started_ns, values.ended_ns = item
            aggregator.clear()
            started = item[1]
            if on_interval is not None:
                on_interval(values)
        values = _values(aggregator, final=True)
        values.started_ns = started or self._time_span[0]
        values.ended_ns = self._time_span[1]
        return values

    def _aggregator(self) -> EventAggregator | LatencyAggregator:
        request = self.request
        plan = KeyPlan(self.fields)
        if request.kind == "latency":
            return LatencyAggregator(
                f"@latency_{request.unit}",
                plan,
                self.returns,
                unit=request.unit,
                keep_spans=request.keep_spans,
                nested=True,
            )
        name = {"count": "@count", "stacks": "@stacks"}.get(request.kind, f"@{request.of}")
        retval = RETURN_VALUE if self._retval_index else None
        if not self.stack_fields:
            return EventAggregator(name, plan, of=self.of, scale=request.scale, retval_arg=retval)
        stacks = StackOptions(
            method="fp",
            kernel_user_walk="ustack" in self.fields,
            kernel_stacks="kstack" in self.fields,
            at_function_entry={t.name: RETURN_ADDRESS in t.arg_names for t in self.selected},
        )
        frames = RecordedFrames(self.recording.facts, self.recording.context.symbols)
        return EventAggregator(
            name,
            plan,
            of=self.of,
            scale=request.scale,
            retval_arg=retval,
            symbolizer=frames,
            stacks=stacks,
        )

    def _batches(self) -> Iterator[EventBatch]:
        """The recording's batches holding only the selected events, as aggregated (and, when
        stacks are keys, the stack records that follow a selected event on its CPU)."""
        types = self._as_aggregated
        retvals = self._retval_index
        with_stacks = bool(self.stack_fields)
        follows: dict[int, bool] = {}
        first = last = 0
        for batch in self.recording.batches():
            self.lost += max(batch.lost, 0)
            events: list[Event] = []
            for event in batch.events:
                typed = types.get(event.type)
                if with_stacks:
                    if is_stack_record(event.type):
                        if follows.get(event.cpu):
                            events.append(event)
                        continue
                    follows[event.cpu] = typed is not None
                if typed is None:
                    continue
                index = retvals.get(event.type)
                if index is not None:
                    event = event._replace(type=typed, args=(*event.args, event.args[index]))
                events.append(event)
            if batch.events:
                first = first or batch.events[0].timestamp_ns
                last = max(last, batch.events[-1].timestamp_ns)
            self.events += sum(1 for e in events if not is_stack_record(e.type))
            if events or batch.lost:
                yield EventBatch(events, batch.lost, batch.cpu)
        self._time_span = (first, last)


def recorded_intervals(
    batches: Iterable[EventBatch], step_ns: int
) -> Iterator[EventBatch | tuple[int, int]]:
    """`batches` cut at the ends of intervals of `step_ns` of recorded time, each end given as
    the interval's (start, end) in nanoseconds after its events: the first event starts the
    first interval, an interval with no events is given too (its end right after the
    previous one's). A stack record stays in its event's interval."""
    start: int | None = None
    for batch in batches:
        events: list[Event] = []
        lost = batch.lost
        for event in batch.events:
            timestamp = event.timestamp_ns
            if start is None:
                start = timestamp
            elif timestamp >= start + step_ns and not is_stack_record(event.type):
                if events or lost:
                    yield EventBatch(events, lost, batch.cpu)
                    events, lost = [], 0
                while timestamp >= start + step_ns:
                    yield (start, start + step_ns)
                    start += step_ns
            events.append(event)
        if events or lost:
            yield EventBatch(events, lost, batch.cpu)


def _values(aggregator: EventAggregator | LatencyAggregator, *, final: bool) -> Aggregation:
    if isinstance(aggregator, LatencyAggregator):
        return aggregator.snapshot(final=final)
    return aggregator.snapshot()


def _shown(event_type: EventType) -> str:
    """An event as the list of recorded events names it: tracepoints with their system."""
    if event_type.kind is ProbeKind.TRACEPOINT:
        return label(event_type)
    return event_type.name


def _probed_functions(facts: RecordingFacts) -> dict[str, tuple[object, ...]]:
    """Event name → where its probe is (path and offset, or symbol), from probescope's facts."""
    where: dict[str, tuple[object, ...]] = {}
    for probe in facts.probes:
        event = probe.get("event")
        if event:
            where[event] = (probe.get("path"), probe.get("offset"), probe.get("symbol"))
    return where


def _partner(
    name: str,
    probed: dict[str, tuple[object, ...]],
    by_name: dict[str, EventType],
    *,
    returning: bool,
) -> EventType | None:
    """The recorded return event of entry `name` (`returning`), or the entry of return `name`:
    the one probing the same place, else by name (`NAME` and `NAME__return`)."""
    place = probed.get(name)
    for candidate in by_name.values():
        same_place = place is not None and probed.get(candidate.name) == place
        if same_place and candidate.kind.is_return == returning:
            return candidate
    if returning:
        found = by_name.get(name + RETURN_SUFFIX)
    else:
        found = (
            by_name.get(name.removesuffix(RETURN_SUFFIX)) if name.endswith(RETURN_SUFFIX) else None
        )
    return found if found is not None and found.kind.is_return == returning else None


def _return_value_arguments(facts: RecordingFacts, types: list[EventType]) -> dict[str, int]:
    """Return event name → index of its argument holding the return value: the one its
    recorded definition fetches as `$retval`, else one named `retval`."""
    fetched = {}
    for probe in facts.probes:
        match = _RETVAL_FETCH.search(str(probe.get("definition") or ""))
        if probe.get("event") and match:
            fetched[probe["event"]] = match.group(1)
    found = {}
    for event_type in types:
        if not event_type.kind.is_return:
            continue
        name = fetched.get(event_type.name, "retval")
        if name in event_type.arg_names:
            found[event_type.name] = event_type.arg_names.index(name)
    return found
