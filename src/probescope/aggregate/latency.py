"""Call latency: entry and return events paired per thread, with a per-thread stack of calls.

Every probe of a latency run records the stack pointer (`%sp`): at a function's entry it
points at the return address, and right after the return it is 8 bytes higher. A return is
paired with the open entry of its thread whose stack pointer is exactly 8 below its own —
the same rule the kernel uses to drop stale uretprobe instances. So:

- recursion pairs each call with its own return (a recursive `fib` gives one sample per call);
- entries left below the returning frame, or below a new call (or the same function called
  again at the same place) were abandoned by `longjmp`, an exception or a thread cancel: they
  are dropped and counted;
- a return with no such entry (its entry was lost, or happened before tracing began) is
  dropped and counted; lost events never pair the wrong calls together.

Events recorded without a stack pointer (a recording's, `nested=True`) are paired by nesting
alone: a return closes the innermost open call of its function on its thread, and the calls
opened after that one are dropped as abandoned. That pairs recursion and ordinary calls as the
stack pointer does; it cannot tell a call abandoned by longjmp until its function returns
again on that thread (a re-entered frame is not seen).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from probescope.aggregate.aggregators import StackOptions, StackResolver
from probescope.aggregate.keys import KeyPlan, probe_label
from probescope.aggregate.maps import AggregateMap, Aggregation, Key, Span
from probescope.aggregate.symbolize import Symbolizer
from probescope.aggregate.values import Frame, Latency
from probescope.events import HIDDEN_PREFIX, Event, EventBatch, EventType

STACK_POINTER = f"{HIDDEN_PREFIX}sp"
RETURN_VALUE = f"{HIDDEN_PREFIX}retval"
ABANDONED = "calls abandoned (longjmp, exception)"
UNMATCHED = "returns without their entry"
OPEN = "calls still open at the end"
MAX_SPANS = 1_000_000


@dataclass
class _Open:
    entry: str
    sp: int
    event: Event


class LatencyAggregator:
    """Latency per key of calls to the probed functions.

    `returns` maps each return event's name to its entry event's name. `unit` is the unit of
    the histogram buckets. With `keep_spans`, each call is also kept as a Span (for evented
    profiles), up to MAX_SPANS.
    """

    def __init__(
        self,
        name: str,
        plan: KeyPlan,
        returns: dict[str, str],
        *,
        unit: str = "us",
        symbolizer: Symbolizer | None = None,
        stacks: StackOptions | None = None,
        keep_spans: bool = False,
        retval_arg: str = RETURN_VALUE,
        nested: bool = False,
    ) -> None:
        self.name = name
        self.plan = plan
        self.returns = returns
        self.entries = set(returns.values())
        self.unit = unit
        self.keep_spans = keep_spans
        self.retval_arg = retval_arg
        self.nested = nested
        self.resolver = StackResolver(symbolizer or Symbolizer(), stacks or StackOptions())
        self.values: dict[Key, Latency] = {}
        self.result = Aggregation()
        self._threads: dict[int, list[_Open]] = {}
        self._sp: dict[EventType, int | None] = {}
        self._keys: dict[tuple[EventType, EventType], Callable[..., Key]] = {}

    def _sp_index(self, event_type: EventType) -> int | None:
        if event_type not in self._sp:
            names = event_type.arg_names
            self._sp[event_type] = names.index(STACK_POINTER) if STACK_POINTER in names else None
        return self._sp[event_type]

    def add_batch(self, batch: EventBatch) -> None:
        if batch.lost:
            self.result.count("lost events", max(batch.lost, 0))
        for event in batch.events:
            event_type = event[5]
            name = event_type.name
            if name in self.entries:
                self._enter(event, event_type)
            elif name in self.returns:
                self._return(event, event_type)

    def add(self, event: Event) -> None:
        self.add_batch(EventBatch([event]))

    def _enter(self, event: Event, event_type: EventType) -> None:
        if self.nested:
            self._threads.setdefault(event.tid, []).append(_Open(event_type.name, 0, event))
            return
        index = self._sp_index(event_type)
        if index is None:
            return
        sp = event.args[index]
        name = event_type.name
        stack = self._threads.setdefault(event.tid, [])
        # A call at this stack position ends every call that was deeper (a frame can only be
        # reused once its owner has gone: longjmp, an exception), and an earlier call of the
        # same function at the same position (a loop that longjmps out of it). Other functions
        # at the same position stay: a tail call reuses its caller's frame.
        while stack and (stack[-1].sp < sp or (stack[-1].sp == sp and stack[-1].entry == name)):
            stack.pop()
            self.result.count(ABANDONED)
        stack.append(_Open(name, sp, event))

    def _return(self, event: Event, event_type: EventType) -> None:
        if self.nested:
            self._return_nested(event, event_type)
            return
        index = self._sp_index(event_type)
        if index is None:
            return
        entry_name = self.returns[event_type.name]
        expected = event.args[index] - 8
        stack = self._threads.get(event.tid)
        if not stack:
            self.result.count(UNMATCHED)
            return
        while stack and stack[-1].sp < expected:
            stack.pop()
            self.result.count(ABANDONED)
        match = None
        for position in range(len(stack) - 1, -1, -1):
            opened = stack[position]
            if opened.sp != expected:
                break
            if opened.entry == entry_name:
                match = position
                break
        if match is None:
            self.result.count(UNMATCHED)
            return
        opened = stack.pop(match)
        self._record(opened.event, event, event_type)

    def _return_nested(self, event: Event, event_type: EventType) -> None:
        entry_name = self.returns[event_type.name]
        stack = self._threads.get(event.tid) or []
        for position in range(len(stack) - 1, -1, -1):
            if stack[position].entry == entry_name:
                opened = stack[position]
                if position < len(stack) - 1:
                    self.result.count(ABANDONED, len(stack) - position - 1)
                del stack[position:]
                self._record(opened.event, event, event_type)
                return
        self.result.count(UNMATCHED)

    def _record(self, entry: Event, ret: Event, return_type: EventType) -> None:
        entry_type = entry.type
        key_of = self._keys.get((entry_type, return_type))
        if key_of is None:
            getters = {}
            if "ustack" in self.plan.fields:
                getter = self.resolver.user_getter(entry_type)
                if getter is not None:
                    getters["ustack"] = getter
            key_of = self.plan.compile(
                return_type,
                label=probe_label(entry_type),
                stacks=getters,
                retval_arg=self.retval_arg,
                args_from=entry_type,
            )
            self._keys[(entry_type, return_type)] = key_of
        key = key_of(entry, entry, ret)
        duration = ret.timestamp_ns - entry.timestamp_ns
        value = self.values.get(key)
        if value is None:
            value = self.values[key] = Latency(self.unit)
        value.add(duration)
        if self.keep_spans:
            if len(self.result.spans) >= MAX_SPANS:
                self.result.count("calls not kept for the evented profile")
                return
            stack: tuple[Frame, ...] = ()
            if "ustack" in self.plan.fields:
                part = key[self.plan.fields.index("ustack")]
                stack = part if isinstance(part, tuple) else ()
            self.result.spans.append(
                Span(
                    entry.pid,
                    entry.tid,
                    entry.comm,
                    entry.timestamp_ns,
                    ret.timestamp_ns,
                    probe_label(entry_type),
                    stack,
                )
            )

    def flush(self) -> None:
        """Nothing waits in this aggregator; open calls stay open."""

    def snapshot(self, *, final: bool = False) -> Aggregation:
        result = self.result.copy()
        result.maps.insert(
            0,
            AggregateMap(
                self.name, self.plan.fields, {k: v.copy() for k, v in self.values.items()}
            ),
        )
        if final:
            still_open = sum(len(stack) for stack in self._threads.values())
            if still_open:
                result.count(OPEN, still_open)
        return result

    def clear(self) -> None:
        """Start a new interval: values and counters go, calls in progress stay open."""
        self.values.clear()
        self.result = Aggregation()
