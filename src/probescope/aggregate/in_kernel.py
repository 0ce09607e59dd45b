"""Aggregation inside the kernel, from the aggregate layer's side: which plans an engine can
aggregate itself (`kernel_request`, or the reason why not), and the values it computed read
into the value model (`KernelReader`), so that they are the same values the user-space
aggregators give: keys named by the same rule, stacks symbolized by the same symbolizer,
per-CPU words merged like any other values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probescope.aggregate.keys import probe_label
from probescope.aggregate.latency import ABANDONED, OPEN, RETURN_VALUE, UNMATCHED
from probescope.aggregate.maps import AggregateMap, Aggregation, Key, KeyPart
from probescope.aggregate.plan import Plan
from probescope.aggregate.symbolize import Symbolizer
from probescope.aggregate.values import (
    LOG2,
    UNITS,
    Count,
    Histogram,
    Latency,
    LinearScale,
    Scale,
    Value,
    merge_values,
)
from probescope.engines.aggregation import AggregatingEngine, KernelAggregation, KernelValues

COUNTER_NAMES: Mapping[str, str] = {
    "map_full": "hits not counted: the kernel's map of keys was full",
    "stack_lost": "stacks the kernel could not record (its stack map was full)",
    "abandoned": ABANDONED,
    "unmatched": UNMATCHED,
    "too_deep": "calls nested too deep to time in the kernel",
    "open": OPEN,
}
"""The engine's counters under the names the user-space aggregators count them."""


def kernel_request(plan: Plan, *, intervals: bool = False) -> KernelAggregation | str:
    """What an engine computes in the kernel for `plan` (a plan made `in_kernel`), or why
    this request needs every hit in user space."""
    request = plan.request
    fields = plan.fields
    if request.kind == "latency" and request.keep_spans:
        return "an evented profile (-o FILE.speedscope.json) keeps every call"
    if "ustack" in fields and request.stack_method != "fp":
        return (
            "user stacks by DWARF CFI are unwound in user space from a copy of each hit's "
            "stack (--stack-method fp walks them in the kernel)"
        )
    if request.kind in ("count", "stacks"):
        return KernelAggregation("count", fields, retval=RETURN_VALUE, intervals=intervals)
    if request.kind == "hist":
        scale = request.scale
        linear = (scale.min, scale.max, scale.step) if isinstance(scale, LinearScale) else None
        return KernelAggregation(
            "hist", fields, of=request.of, linear=linear, retval=RETURN_VALUE, intervals=intervals
        )
    return KernelAggregation(
        "latency",
        fields,
        unit_ns=UNITS[request.unit],
        retval=RETURN_VALUE,
        intervals=intervals,
    )


class KernelReader:
    """The values an engine keeps in the kernel, read into an Aggregation. With intervals
    each `snapshot` drains the kernel's maps into the values kept since the last `clear`;
    without, it reads them as they stand."""

    def __init__(
        self,
        name: str,
        plan: Plan,
        engine: AggregatingEngine,
        symbolizer: Symbolizer,
        *,
        intervals: bool,
    ) -> None:
        self.name = name
        self.fields = plan.fields
        self.request = plan.request
        self.engine = engine
        self.symbolizer = symbolizer
        self.intervals = intervals
        self.kept = Aggregation()

    def snapshot(self, *, final: bool = False) -> Aggregation:
        read = self.engine.read_aggregation(clear=self.intervals, final=final)
        values = self.convert(read)
        if not self.intervals:
            return values
        self.kept.merge(values)
        return self.kept.copy()

    def clear(self) -> None:
        self.kept = Aggregation()

    def flush(self) -> None:
        """Nothing waits here: every hit is in the kernel's maps."""

    def convert(self, read: KernelValues) -> Aggregation:
        result = Aggregation()
        values: dict[Key, Value] = {}
        labels = {index: probe_label(t) for index, t in read.event_types.items()}
        for entry in read.entries:
            key = tuple(
                self._part(name, part, entry.probe, entry.pid, labels)
                for name, part in zip(self.fields, entry.parts, strict=True)
            )
            value = self._value(entry.per_cpu)
            if value is None:
                continue
            mine = values.get(key)
            if mine is None:
                values[key] = value
            else:
                merge_values(mine, value)
        result.maps.append(AggregateMap(self.name, self.fields, values))
        for counter, amount in read.counters.items():
            result.count(COUNTER_NAMES.get(counter, counter), amount)
        if self.symbolizer.unresolved:
            result.count("stack frames not symbolized", self.symbolizer.unresolved)
            self.symbolizer.unresolved = 0
        return result

    def _part(
        self, name: str, part: object, probe: int, pid: int | None, labels: dict[int, str]
    ) -> KeyPart:
        if name == "probe":
            return labels.get(probe, str(probe))
        if name == "ustack":
            addresses: Any = part
            return self.symbolizer.user_stack(pid or 0, addresses) if addresses else ()
        if name == "kstack":
            addresses = part
            return self.symbolizer.kernel_stack(addresses) if addresses else ()
        assert part is None or isinstance(part, int | str)
        return part

    def _value(self, per_cpu: tuple[tuple[int | None, ...], ...]) -> Value | None:
        kind = self.request.kind
        if kind in ("count", "stacks"):
            count = Count.from_per_cpu(int(words[0] or 0) for words in per_cpu)
            return count if count.value else None
        scale: Scale = (self.request.scale or LOG2) if kind == "hist" else LOG2
        merged: Histogram | None = None
        for words in per_cpu:
            *buckets, hits, total, low, high = words
            if not hits:
                continue
            histogram = Histogram(
                scale,
                {i: int(n or 0) for i, n in enumerate(buckets) if n},
                int(hits),
                int(total or 0),
                low,
                high,
            )
            merged = histogram if merged is None else merged.merge(histogram)
        if merged is None:
            return None
        if kind == "hist":
            return merged
        unit = UNITS[self.request.unit]
        latency = Latency(self.request.unit, merged, merged.count, merged.total)
        latency.min_ns, latency.max_ns = merged.min, merged.max
        # the histogram is of durations in the unit: its sum and extremes in it too
        merged.total //= unit
        merged.min = None if merged.min is None else merged.min // unit
        merged.max = None if merged.max is None else merged.max // unit
        return latency
