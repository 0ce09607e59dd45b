"""Keyed values (AggregateMap, bpftrace's `@name[key]`) and the result of a run (Aggregation).

A map's key is a tuple with one part per key field (`probe`, `comm`, `pid`, an argument, a
stack ...); its values are all of one kind. Maps merge key by key; an Aggregation merges
map by map and adds its counters, so per-CPU, per-interval and per-recording results combine
the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from probescope.aggregate.values import (
    AggregateError,
    Count,
    Frame,
    Histogram,
    Latency,
    Stack,
    Stacks,
    Value,
    merge_values,
)

KeyPart = str | int | tuple[Frame, ...] | None
Key = tuple[KeyPart, ...]

STACK_FIELDS = frozenset({"ustack", "kstack"})
KEY_MODULE_PREFIX = "[key:"
"""The module of a frame that stands for a non-stack key part at the root of a flame graph."""


class Span(NamedTuple):
    """One timed call, kept for evented profiles: who, when (ns), and where from."""

    pid: int
    tid: int
    comm: str
    start_ns: int
    end_ns: int
    probe: str
    stack: Stack = ()


@dataclass
class AggregateMap:
    """Values by key, all of one kind. `key_names` names the key's parts in order."""

    name: str
    key_names: tuple[str, ...] = ()
    values: dict[Key, Value] = field(default_factory=dict)

    def merge(self, other: AggregateMap) -> AggregateMap:
        if other.key_names != self.key_names:
            raise AggregateError(
                f"cannot merge map {other.name} keyed by {', '.join(other.key_names) or '()'} "
                f"into {self.name} keyed by {', '.join(self.key_names) or '()'}"
            )
        for key, value in other.values.items():
            mine = self.values.get(key)
            if mine is None:
                self.values[key] = value.copy()
            else:
                merge_values(mine, value)
        return self

    def clear(self) -> None:
        self.values.clear()

    def copy(self) -> AggregateMap:
        return AggregateMap(
            self.name, self.key_names, {k: v.copy() for k, v in self.values.items()}
        )

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: Key) -> Value:
        return self.values[key]

    def get(self, key: Key) -> Value | None:
        return self.values.get(key)

    def items(self) -> Iterator[tuple[Key, Value]]:
        return iter(self.values.items())

    def sorted_items(self) -> list[tuple[Key, Value]]:
        """Smallest first, as bpftrace prints (so the largest ends up next to the prompt):
        counts by value, histograms and latencies by how many values they hold."""
        return sorted(self.values.items(), key=lambda item: (weight(item[1]), _key_text(item[0])))

    def top(self, count: int) -> AggregateMap:
        """The `count` heaviest keys."""
        kept = self.sorted_items()[-count:] if count > 0 else []
        return AggregateMap(self.name, self.key_names, dict(kept))

    def counts(self) -> dict[Key, int]:
        """Each key's weight as a plain number (a count, or how many values it holds)."""
        return {key: weight(value) for key, value in self.values.items()}

    def stacks(self, *, unit: str | None = None) -> Stacks:
        """The map as weighted stacks for flame graphs: the stack parts of each key (user
        stack under kernel stack, as perf draws them) become the frames, the other parts
        frames at the root; the weight is the count, or the latency's total nanoseconds."""
        first = next(iter(self.values.values()), None)
        result = Stacks(unit=unit or ("ns" if isinstance(first, Latency) else "samples"))
        for key, value in self.values.items():
            frames: list[Frame] = []
            kernel: Stack = ()
            user: Stack = ()
            for name, part in zip(self.key_names, key, strict=True):
                if name == "kstack" and isinstance(part, tuple):
                    kernel = part
                elif name == "ustack" and isinstance(part, tuple):
                    user = part
                else:
                    frames.append(Frame(str(part), 0, f"{KEY_MODULE_PREFIX}{name}]"))
            stack = (*kernel, *user, *reversed(frames))
            if isinstance(value, Latency) and result.unit == "ns":
                result.add(stack, value.total_ns)
            else:
                result.add(stack, weight(value))
        return result


def weight(value: Value) -> int:
    if isinstance(value, Count):
        return value.value
    if isinstance(value, Histogram | Latency):
        return value.count
    return value.total


def _key_text(key: Key) -> str:
    return repr(key)


@dataclass
class Aggregation:
    """What one run (or one interval of it) aggregated: its maps, counters of what could not
    be aggregated (lost events, broken pairs ...), and the timed calls of an evented profile."""

    maps: list[AggregateMap] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    started_ns: int = 0
    ended_ns: int = 0

    def map(self, name: str) -> AggregateMap:
        for found in self.maps:
            if found.name == name:
                return found
        raise KeyError(name)

    @property
    def first(self) -> AggregateMap:
        """The main map of a command that makes one (count, hist, latency, stacks)."""
        return self.maps[0]

    def count(self, counter: str, amount: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + amount

    def merge(self, other: Aggregation) -> Aggregation:
        for theirs in other.maps:
            try:
                self.map(theirs.name).merge(theirs)
            except KeyError:
                self.maps.append(theirs.copy())
        for counter, amount in other.counters.items():
            self.count(counter, amount)
        self.spans += other.spans
        if other.started_ns and (not self.started_ns or other.started_ns < self.started_ns):
            self.started_ns = other.started_ns
        self.ended_ns = max(self.ended_ns, other.ended_ns)
        return self

    def copy(self) -> Aggregation:
        return Aggregation(
            [m.copy() for m in self.maps],
            dict(self.counters),
            list(self.spans),
            self.started_ns,
            self.ended_ns,
        )

    def clear(self) -> None:
        for found in self.maps:
            found.clear()
        self.counters.clear()
        self.spans.clear()
