"""The values an aggregation holds per key: Count, Histogram (log2 or linear), Latency, Stacks.

Every value merges with another of its kind (per CPU, per interval, across recordings), and
can be built from the raw counters an in-kernel map holds (`Count.from_per_cpu`,
`Histogram.from_buckets`, `Latency.from_parts`), so a bpf engine reading its maps and the
user-space aggregators give the same values. Rendering lives in `aggregate.render`.

Bucket numbering follows bpftrace, so a BPF program can compute the same index:
log2 — 0 holds negative values, 1 holds 0, and `i ≥ 2` holds [2^(i-2), 2^(i-1));
linear — 0 holds values below `min`, `i` in 1..N holds [min+(i-1)·step, min+i·step),
N+1 holds values ≥ `max`, with N = (max − min) / step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from probescope.errors import ProbescopeError


class AggregateError(ProbescopeError):
    """Values of different kinds or shapes that cannot be merged, or a bad scale."""


# --- counts --------------------------------------------------------------------------------


@dataclass
class Count:
    """How many times a key was seen."""

    value: int = 0

    def merge(self, other: Count) -> Count:
        self.value += other.value
        return self

    @classmethod
    def from_per_cpu(cls, values: Iterable[int]) -> Count:
        """A per-CPU map slot (one counter per CPU) as one count."""
        return cls(sum(values))

    def copy(self) -> Count:
        return Count(self.value)


# --- histograms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Log2Scale:
    """Power-of-two buckets, numbered as bpftrace's `hist()` numbers them."""

    @staticmethod
    def index(value: int) -> int:
        if value < 0:
            return 0
        if value == 0:
            return 1
        return value.bit_length() + 1

    @staticmethod
    def bounds(index: int) -> tuple[int | None, int | None]:
        """(lowest, highest) value of bucket `index`; None where it is open."""
        if index == 0:
            return None, -1
        if index == 1:
            return 0, 0
        return 1 << (index - 2), (1 << (index - 1)) - 1

    def describe(self) -> str:
        return "log2"


@dataclass(frozen=True)
class LinearScale:
    """Buckets of width `step` from `min` up to `max`, as bpftrace's `lhist()`."""

    min: int
    max: int
    step: int

    def __post_init__(self) -> None:
        if self.step <= 0:
            raise AggregateError(f"linear histogram step must be positive, not {self.step}")
        if self.max <= self.min:
            raise AggregateError(
                f"linear histogram max {self.max} must be above its min {self.min}"
            )
        if (self.max - self.min) % self.step:
            raise AggregateError(
                f"linear histogram range {self.min}..{self.max} is not a whole number of "
                f"steps of {self.step}",
                hint="choose MIN, MAX and STEP so that (MAX - MIN) is a multiple of STEP",
            )

    @property
    def buckets(self) -> int:
        """Buckets inside [min, max), not counting the two open ends."""
        return (self.max - self.min) // self.step

    def index(self, value: int) -> int:
        if value < self.min:
            return 0
        if value >= self.max:
            return self.buckets + 1
        return (value - self.min) // self.step + 1

    def bounds(self, index: int) -> tuple[int | None, int | None]:
        if index == 0:
            return None, self.min - 1
        if index == self.buckets + 1:
            return self.max, None
        low = self.min + (index - 1) * self.step
        return low, low + self.step - 1

    def describe(self) -> str:
        return f"linear {self.min},{self.max},{self.step}"


Scale = Log2Scale | LinearScale
LOG2 = Log2Scale()


@dataclass
class Histogram:
    """A distribution: counts per bucket of `scale`, plus count, sum, min and max."""

    scale: Scale = LOG2
    buckets: dict[int, int] = field(default_factory=dict)
    count: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None

    def add(self, value: int, times: int = 1) -> None:
        index = self.scale.index(value)
        self.buckets[index] = self.buckets.get(index, 0) + times
        self.count += times
        self.total += value * times
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> Histogram:
        if other.scale != self.scale:
            raise AggregateError(
                f"cannot merge a {other.scale.describe()} histogram into a "
                f"{self.scale.describe()} one"
            )
        for index, times in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + times
        self.count += other.count
        self.total += other.total
        if other.min is not None and (self.min is None or other.min < self.min):
            self.min = other.min
        if other.max is not None and (self.max is None or other.max > self.max):
            self.max = other.max
        return self

    @classmethod
    def from_buckets(
        cls,
        counts: Sequence[int] | Mapping[int, int],
        scale: Scale = LOG2,
        *,
        total: int | None = None,
    ) -> Histogram:
        """A histogram from bucket counters (a BPF array indexed like `scale.index`); the
        count is their sum, min and max stay unknown, `total` is the sum when it was kept."""
        items = counts.items() if isinstance(counts, Mapping) else enumerate(counts)
        buckets = {int(index): int(n) for index, n in items if n}
        return cls(scale, buckets, sum(buckets.values()), total or 0)

    def rows(self) -> list[tuple[int, int]]:
        """(bucket index, count) from the first non-empty bucket to the last, empty ones
        between included — the rows bpftrace prints."""
        if not self.buckets:
            return []
        first, last = min(self.buckets), max(self.buckets)
        return [(index, self.buckets.get(index, 0)) for index in range(first, last + 1)]

    @property
    def average(self) -> int:
        return self.total // self.count if self.count else 0

    def copy(self) -> Histogram:
        return Histogram(self.scale, dict(self.buckets), self.count, self.total, self.min, self.max)


# --- latency -------------------------------------------------------------------------------

UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass
class Latency:
    """How long calls took: a log2 histogram of durations in `unit`, with the exact count,
    sum, min and max kept in nanoseconds."""

    unit: str = "us"
    histogram: Histogram = field(default_factory=Histogram)
    count: int = 0
    total_ns: int = 0
    min_ns: int | None = None
    max_ns: int | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise AggregateError(
                f"unknown latency unit {self.unit!r}", hint=f"choose one of {', '.join(UNITS)}"
            )

    def add(self, duration_ns: int) -> None:
        self.histogram.add(duration_ns // UNITS[self.unit])
        self.count += 1
        self.total_ns += duration_ns
        if self.min_ns is None or duration_ns < self.min_ns:
            self.min_ns = duration_ns
        if self.max_ns is None or duration_ns > self.max_ns:
            self.max_ns = duration_ns

    def merge(self, other: Latency) -> Latency:
        if other.unit != self.unit:
            raise AggregateError(f"cannot merge latencies in {other.unit} into {self.unit}")
        self.histogram.merge(other.histogram)
        self.count += other.count
        self.total_ns += other.total_ns
        if other.min_ns is not None and (self.min_ns is None or other.min_ns < self.min_ns):
            self.min_ns = other.min_ns
        if other.max_ns is not None and (self.max_ns is None or other.max_ns > self.max_ns):
            self.max_ns = other.max_ns
        return self

    @classmethod
    def from_parts(
        cls,
        buckets: Sequence[int] | Mapping[int, int],
        *,
        unit: str = "us",
        count: int,
        total_ns: int,
        min_ns: int | None = None,
        max_ns: int | None = None,
    ) -> Latency:
        """A latency from in-kernel counters: log2 buckets of durations in `unit`, and the
        count and sum (and extremes, if kept) in nanoseconds."""
        histogram = Histogram.from_buckets(buckets)
        return cls(unit, histogram, count, total_ns, min_ns, max_ns)

    def in_unit(self, nanoseconds: int | None) -> int:
        return 0 if nanoseconds is None else nanoseconds // UNITS[self.unit]

    @property
    def average_ns(self) -> int:
        return self.total_ns // self.count if self.count else 0

    def copy(self) -> Latency:
        return Latency(
            self.unit, self.histogram.copy(), self.count, self.total_ns, self.min_ns, self.max_ns
        )


# --- stacks --------------------------------------------------------------------------------


class Frame(NamedTuple):
    """One frame of a call stack: `function` and the byte `offset` of the address inside it,
    and the `module` (file path, `[kernel]`) it lies in. An address no symbol covers keeps its
    hexadecimal text as `function` (and offset 0)."""

    function: str
    offset: int = 0
    module: str = ""

    def __str__(self) -> str:
        return f"{self.function}+{self.offset}" if self.offset else self.function


Stack = tuple[Frame, ...]
"""Frames from the innermost (where the probe hit) outwards."""


@dataclass
class Stacks:
    """A weighted set of stacks: the input of folded stacks and flame graphs.

    `weights` maps a stack (innermost frame first) to how many samples (unit `samples`) or
    how many nanoseconds (unit `ns`) it stands for.
    """

    weights: dict[Stack, int] = field(default_factory=dict)
    unit: str = "samples"

    def add(self, stack: Stack, weight: int = 1) -> None:
        self.weights[stack] = self.weights.get(stack, 0) + weight

    def merge(self, other: Stacks) -> Stacks:
        if other.unit != self.unit:
            raise AggregateError(f"cannot merge stacks weighted in {other.unit} into {self.unit}")
        for stack, weight in other.weights.items():
            self.add(stack, weight)
        return self

    @property
    def total(self) -> int:
        return sum(self.weights.values())

    def __iter__(self) -> Iterator[tuple[Stack, int]]:
        return iter(self.weights.items())

    def __len__(self) -> int:
        return len(self.weights)

    def copy(self) -> Stacks:
        return Stacks(dict(self.weights), self.unit)


Value = Count | Histogram | Latency | Stacks


def merge_values(into: Value, other: Value) -> Value:
    """Merge `other` into `into` (same kind), returning `into`."""
    if type(into) is not type(other):
        raise AggregateError(f"cannot merge a {type(other).__name__} into a {type(into).__name__}")
    return into.merge(other)  # type: ignore[arg-type]
