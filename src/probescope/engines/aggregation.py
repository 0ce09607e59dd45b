"""Aggregation inside the kernel, as an engine sees it: what to compute at each hit
(`KernelAggregation`, given to the engine in `EngineOptions.aggregation`) and the raw values it
hands back (`KernelValues`: per-CPU words by key). The aggregate layer builds the request from
its plan and turns the words into its values; only an engine that can run programs at a hit
(the bpf engine) implements `AggregatingEngine`.

Histogram buckets are numbered as `aggregate.values` numbers them (bpftrace's numbering):
log2 — 0 for negative values, 1 for 0, `bit_length(v) + 1` above; linear — 0 below `min`,
`(v - min) // step + 1` inside, `(max - min) // step + 1` at or above `max`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from probescope.events import EventType
from probescope.language.resolved import ResolvedProbe

KINDS = ("count", "hist", "latency")
BUILTIN_KEYS = ("probe", "comm", "pid", "tid", "cpu", "retval", "ustack", "kstack")
LOG2_BUCKETS = 66
"""log2 buckets: negative, 0, then one per bit length 1..64."""


@dataclass(frozen=True)
class KernelAggregation:
    """What every hit computes in the kernel.

    `kind`: `count` (hits per key), `hist` (a histogram of argument `of` per key) or `latency`
    (entry probes open a call, return probes close it: a histogram of durations per key);
    `fields`: the key, as `--by` names it — probe, comm, pid, tid, cpu, retval (from argument
    `retval`), ustack, kstack, or an argument (a tracepoint field) name; `linear`: (min, max,
    step) buckets, None for log2; `unit_ns`: nanoseconds per latency bucket unit; `intervals`:
    values are read and cleared while attached, so each hit is counted in exactly one read.
    """

    kind: str
    fields: tuple[str, ...]
    of: str | None = None
    linear: tuple[int, int, int] | None = None
    unit_ns: int = 1
    retval: str | None = None
    intervals: bool = False

    @property
    def buckets(self) -> int:
        """Histogram buckets per key (0 for counts)."""
        if self.kind == "count":
            return 0
        if self.linear is not None:
            low, high, step = self.linear
            return (high - low) // step + 2
        return LOG2_BUCKETS


@dataclass(frozen=True)
class KernelEntry:
    """One key's value: `probe` (index into `KernelValues.event_types`; for latency the
    entry's), `parts` one per key field (int, str, None where the probe has no such argument,
    a tuple of addresses for stacks, innermost first), `pid` the process the hits came from
    (for placing user-stack addresses), and `per_cpu` each CPU's value words: a count;
    or buckets, count, sum, min, max (latency: of durations, sum/min/max in nanoseconds;
    min and max None on a CPU that counted nothing)."""

    probe: int
    parts: tuple[object, ...]
    pid: int | None
    per_cpu: tuple[tuple[int | None, ...], ...]


@dataclass
class KernelValues:
    """What the maps held at a read: entries, the EventType of each probe index, and
    counters of what could not be counted (`map_full`, `stack_lost`, latency's `abandoned`,
    `unmatched`, `too_deep`, and `open` calls at the final read)."""

    entries: list[KernelEntry] = field(default_factory=list)
    event_types: dict[int, EventType] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class AggregatingEngine(Protocol):
    """An engine that aggregates in the kernel when `EngineOptions.aggregation` is set: its
    `events()` then yields only empty batches (the pace of the session), and the values are
    read with `read_aggregation`."""

    def can_aggregate(
        self, aggregation: KernelAggregation, probes: Sequence[ResolvedProbe]
    ) -> str | None:
        """Why these probes cannot be aggregated this way here (None when they can)."""
        ...

    def read_aggregation(self, *, clear: bool = False, final: bool = False) -> KernelValues:
        """The values so far (since the last clearing read); `clear` starts a new interval
        without losing a hit; `final` also counts the calls still open."""
        ...
