"""User-space aggregation of an event stream: counts, histograms and stack counts per key.

`EventAggregator` takes `EventBatch`es from any engine. For each event type it compiles, once,
a handler that builds the key straight from the Event tuple and updates a plain dict; values
become `Count`/`Histogram` objects only when a snapshot is taken. Stacks come from a copied
stack (unwound here) or, when the kernel walks them (tracefs `userstacktrace`/`stacktrace`),
from the `user_stack`/`kernel_stack` records the kernel writes right after the event on the
same CPU: such an event waits for its records until the next event of that CPU arrives.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from probescope.aggregate.keys import STACK_FIELDS, KeyFunction, KeyPlan
from probescope.aggregate.maps import AggregateMap, Aggregation, Key, KeyPart
from probescope.aggregate.stack_capture import return_address_reader, sample_reader
from probescope.aggregate.symbolize import Symbolizer
from probescope.aggregate.unwind import unwind_dwarf, walk_frame_pointers
from probescope.aggregate.values import Count, Histogram, Scale
from probescope.errors import ProbescopeError
from probescope.events import HIDDEN_PREFIX, Event, EventBatch, EventType

USER_STACK_RECORD = "user_stack"
KERNEL_STACK_RECORD = "kernel_stack"
_ULONG_MAX = (1 << 64) - 1
_TRAMPOLINE_MARKER = 0x7FFFFFFF


def is_stack_record(event_type: EventType) -> bool:
    return event_type.group == "ftrace" and event_type.name in (
        USER_STACK_RECORD,
        KERNEL_STACK_RECORD,
    )


@dataclass
class StackOptions:
    """Where the stacks of the key come from: `method` (dwarf/fp) for copied stacks; the
    kernel walks user stacks (`kernel_user_walk`) and kernel stacks (`kernel_stacks`)."""

    method: str = "dwarf"
    kernel_user_walk: bool = False
    kernel_stacks: bool = False
    at_function_entry: dict[str, bool] = field(default_factory=dict)


class StackResolver:
    """Stacks of one event: from its copied stack, or from the kernel records attached."""

    def __init__(self, symbolizer: Symbolizer, options: StackOptions) -> None:
        self.symbolizer = symbolizer
        self.options = options
        self.user_record: bytes | None = None
        self.kernel_record: bytes | None = None
        self.unwind_failed = 0

    def user_getter(self, event_type: EventType) -> Callable[[Event], KeyPart] | None:
        at_entry = self.options.at_function_entry.get(event_type.name, False)
        symbolizer = self.symbolizer
        if self.options.kernel_user_walk:
            caller = return_address_reader(event_type)

            def from_kernel(event: Event) -> KeyPart:
                record = self.user_record
                if record is None:
                    return ()
                pcs = user_addresses(record)
                if at_entry and caller is not None and pcs:
                    pcs.insert(1, caller(event))
                return symbolizer.user_stack(event.pid, pcs)

            return from_kernel
        read = sample_reader(event_type, at_function_entry=at_entry)
        if read is None:
            return None
        if self.options.method == "fp":

            def by_frame_pointers(event: Event) -> KeyPart:
                sample = read(event)
                if sample is None:
                    return ()
                return symbolizer.user_stack(event.pid, walk_frame_pointers(sample))

            return by_frame_pointers

        def by_cfi(event: Event) -> KeyPart:
            sample = read(event)
            if sample is None:
                return ()
            pid = event.pid
            return symbolizer.user_stack(pid, unwind_dwarf(sample, symbolizer.code_lookup(pid)))

        return by_cfi

    def kernel_getter(self) -> Callable[[Event], KeyPart]:
        def from_record(event: Event) -> KeyPart:
            raw = self.kernel_record
            if raw is None:
                return ()
            return self.symbolizer.kernel_stack(kernel_addresses(raw))

        return from_record


def user_addresses(raw: bytes) -> list[int]:
    """The return addresses of a `user_stack` record, up to the first 0 (the kernel
    zero-fills the entries after the last)."""
    addresses = []
    for (address,) in struct.iter_unpack("<Q", raw[: len(raw) // 8 * 8]):
        if not address:
            break
        addresses.append(address)
    return addresses


def kernel_addresses(raw: bytes) -> list[int]:
    """The callers of a `kernel_stack` record, up to its ULONG_MAX (or 0) end mark."""
    addresses = []
    for (address,) in struct.iter_unpack("<Q", raw[: len(raw) // 8 * 8]):
        if address in (_ULONG_MAX, 0):
            break
        if address != _TRAMPOLINE_MARKER:
            addresses.append(address)
    return addresses


class EventAggregator:
    """Counts (`of` None) or histograms (`of` an argument name) of events per key.

    `name` is the map's name (`@count`, `@hist` ...). `retval_arg` names the argument holding
    return values for the `retval` key. `symbolizer` and `stacks` are needed when the key holds
    a stack.
    """

    def __init__(
        self,
        name: str,
        plan: KeyPlan,
        *,
        of: str | None = None,
        scale: Scale | None = None,
        retval_arg: str | None = None,
        symbolizer: Symbolizer | None = None,
        stacks: StackOptions | None = None,
    ) -> None:
        self.name = name
        self.plan = plan
        self.of = of
        self.scale = scale
        self.retval_arg = retval_arg
        self.stacks = stacks or StackOptions()
        self.resolver = StackResolver(symbolizer or Symbolizer(), self.stacks)
        self.counts: dict[Key, int] = {}
        self.histograms: dict[Key, Histogram] = {}
        self.result = Aggregation()
        self._handlers: dict[EventType, Callable[[Event], None]] = {}
        self._pending: dict[int, list[object]] = {}
        self.stack_records = 0
        needs_user = "ustack" in plan.fields and self.stacks.kernel_user_walk
        needs_kernel = "kstack" in plan.fields and self.stacks.kernel_stacks
        self._needs = (needs_user, needs_kernel)
        self._waits = needs_user or needs_kernel

    # -- feeding ----------------------------------------------------------------------------

    def add_batch(self, batch: EventBatch) -> None:
        if batch.lost:
            self.result.count("lost events", max(batch.lost, 0))
            if batch.lost < 0:
                self.result.count("sub-buffers with an unknown loss")
        handlers = self._handlers
        for event in batch.events:
            handler = handlers.get(event[5])
            if handler is None:
                handler = self._compile(event[5])
            handler(event)

    def add(self, event: Event) -> None:
        self.add_batch(EventBatch([event]))

    def _compile(self, event_type: EventType) -> Callable[[Event], None]:
        if is_stack_record(event_type):
            handler = self._stack_record_handler(event_type)
        else:
            handler = self._event_handler(event_type)
        self._handlers[event_type] = handler
        return handler

    def _key_function(self, event_type: EventType) -> KeyFunction:
        getters: dict[str, Callable[[Event], KeyPart]] = {}
        if "ustack" in self.plan.fields:
            getter = self.resolver.user_getter(event_type)
            if getter is not None:
                getters["ustack"] = getter
        if "kstack" in self.plan.fields and self.stacks.kernel_stacks:
            getters["kstack"] = self.resolver.kernel_getter()
        return self.plan.compile(event_type, stacks=getters, retval_arg=self.retval_arg)

    def _event_handler(self, event_type: EventType) -> Callable[[Event], None]:
        key_of = self._key_function(event_type)
        counts = self.counts
        if self.of is None:

            def count(event: Event) -> None:
                key = key_of(event)
                counts[key] = counts.get(key, 0) + 1

            record = count
        else:
            names = event_type.arg_names
            if self.of not in names:

                shown = self.of.removeprefix(HIDDEN_PREFIX)  # __ps_retval: the return value

                def skip(event: Event) -> None:
                    self.result.count(f"events without argument {shown}")

                record = skip
            else:
                index = names.index(self.of)
                histograms = self.histograms
                scale = self.scale
                if event_type.arg_types[index].is_string:
                    raise ProbescopeError(
                        f"argument {self.of!r} of {event_type.name} is a string; "
                        "a histogram needs a number"
                    )

                def add(event: Event) -> None:
                    key = key_of(event)
                    histogram = histograms.get(key)
                    if histogram is None:
                        histogram = histograms[key] = (
                            Histogram(scale) if scale is not None else Histogram()
                        )
                    value = event.args[index]
                    if isinstance(value, int):
                        histogram.add(value)

                record = add
        if not self._waits:
            return record

        def wait_for_records(event: Event) -> None:
            cpu = event.cpu
            self._settle(cpu)
            self._pending[cpu] = [event, record, None, None]

        return wait_for_records

    def _stack_record_handler(self, event_type: EventType) -> Callable[[Event], None]:
        slot = 2 if event_type.name == USER_STACK_RECORD else 3

        def attach(event: Event) -> None:
            self.stack_records += 1
            pending = self._pending.get(event.cpu)
            if pending is None:
                self.result.count("stack records without their event")
                return
            pending[slot] = event.args[-1]
            needs_user, needs_kernel = self._needs
            if (pending[2] is not None or not needs_user) and (
                pending[3] is not None or not needs_kernel
            ):
                self._settle(event.cpu)

        return attach

    def _settle(self, cpu: int) -> None:
        pending = self._pending.pop(cpu, None)
        if pending is None:
            return
        event, record, user, kernel = pending
        resolver = self.resolver
        resolver.user_record = user  # type: ignore[assignment]
        resolver.kernel_record = kernel  # type: ignore[assignment]
        if (self._needs[0] and user is None) or (self._needs[1] and kernel is None):
            self.result.count("events whose stack the kernel did not record")
        record(event)  # type: ignore[operator]
        resolver.user_record = resolver.kernel_record = None

    def flush(self) -> None:
        """Aggregate the events still waiting for stack records (end of stream)."""
        for cpu in list(self._pending):
            self._settle(cpu)

    # -- results ----------------------------------------------------------------------------

    def snapshot(self) -> Aggregation:
        """The values so far (a copy)."""
        self.flush()
        result = self.result.copy()
        values: dict[Key, Count | Histogram]
        if self.of is None:
            values = {key: Count(n) for key, n in self.counts.items()}
        else:
            values = {key: h.copy() for key, h in self.histograms.items()}
        result.maps.insert(0, AggregateMap(self.name, self.plan.fields, dict(values)))
        unresolved = self.resolver.symbolizer.unresolved
        if unresolved:
            result.count("stack frames not symbolized", unresolved)
        return result

    def clear(self) -> None:
        """Start a new interval: forget the values (events waiting for stacks stay)."""
        self.counts.clear()
        self.histograms.clear()
        self.result = Aggregation()
        self.resolver.symbolizer.unresolved = 0


def stack_fields(plan: KeyPlan) -> tuple[str, ...]:
    return tuple(f for f in plan.fields if f in STACK_FIELDS)
