"""Aggregations as terminal text in bpftrace's layout.

Counts print `@name[key1, key2]: value`, smallest first; histograms print `@name[key]: ` and
one row per bucket, `[1K, 2K)          12 |@@@@@   |` (label left in 16 columns, count right
in 8, a 52-column bar scaled to the largest bucket); a latency prints its histogram and then a
`stats()` line (`count N, average A, total T`, here with min and max). A stack in a key prints
on its own lines, one frame per line indented by four spaces, as bpftrace's `ustack` does.
"""

from __future__ import annotations

from typing import IO

from probescope.aggregate.maps import AggregateMap, Aggregation, Key, KeyPart
from probescope.aggregate.values import (
    Count,
    Histogram,
    Latency,
    LinearScale,
    Log2Scale,
    Stacks,
    Value,
)

BAR_WIDTH = 52


def render_text(aggregation: Aggregation, stream: IO[str], *, top: int | None = None) -> None:
    """Every map of `aggregation`, each followed by a blank line."""
    for found in aggregation.maps:
        render_map(found if top is None else found.top(top), stream)


def render_map(aggregate_map: AggregateMap, stream: IO[str]) -> None:
    name = aggregate_map.name
    items = aggregate_map.sorted_items()
    if not items:
        return
    stats: list[str] = []
    for key, value in items:
        label = name + key_text(key)
        if isinstance(value, Count):
            stream.write(f"{label}: {value.value}\n")
        elif isinstance(value, Histogram):
            stream.write(f"{label}: \n")
            stream.write(histogram_text(value))
            stream.write("\n")
        elif isinstance(value, Latency):
            stream.write(f"{label}: \n")
            stream.write(histogram_text(value.histogram))
            stream.write("\n")
            stats.append(f"{name}_stats{key_text(key)}: {latency_stats(value)}\n")
        else:
            stream.write(f"{label}: {stacks_summary(value)}\n")
    if stats:
        stream.write("".join(stats))
    if not isinstance(items[-1][1], Histogram | Latency) or stats:
        stream.write("\n")


def key_text(key: Key) -> str:
    """`[a, b]` for a key (nothing for the empty key), stacks on lines of their own."""
    if not key:
        return ""
    return "[" + ", ".join(part_text(part) for part in key) + "]"


def part_text(part: KeyPart) -> str:
    if isinstance(part, tuple):
        return "\n" + "".join(f"    {frame}\n" for frame in part)
    if part is None:
        return "-"
    return str(part)


def latency_stats(value: Latency) -> str:
    unit = value.unit
    return (
        f"count {value.count}, average {value.in_unit(value.average_ns)}{unit}, "
        f"total {value.in_unit(value.total_ns)}{unit}, min {value.in_unit(value.min_ns)}{unit}, "
        f"max {value.in_unit(value.max_ns)}{unit}"
    )


def stacks_summary(value: Stacks) -> str:
    return f"{len(value)} stacks, {value.total} {value.unit}"


def histogram_text(histogram: Histogram) -> str:
    rows = histogram.rows()
    if not rows:
        return ""
    largest = max(count for _, count in rows) or 1
    lines = []
    for index, count in rows:
        bar = "@" * int(count / largest * BAR_WIDTH)
        lines.append(f"{bucket_label(histogram, index):<16}{count:>8} |{bar:<{BAR_WIDTH}}|\n")
    return "".join(lines)


def bucket_label(histogram: Histogram, index: int) -> str:
    scale = histogram.scale
    if isinstance(scale, Log2Scale):
        if index == 0:
            return "(..., 0)"
        if index == 1:
            return "[0]"
        if index == 2:
            return "[1]"
        return f"[{_power_label(index - 2)}, {_power_label(index - 1)})"
    assert isinstance(scale, LinearScale)
    if index == 0:
        return f"(..., {_linear_label(scale.min)})"
    if index == scale.buckets + 1:
        return f"[{_linear_label(scale.max)}, ...)"
    low = scale.min + (index - 1) * scale.step
    return f"[{_linear_label(low)}, {_linear_label(low + scale.step)})"


def _power_label(power: int) -> str:
    for threshold, suffix in ((60, "E"), (50, "P"), (40, "T"), (30, "G"), (20, "M"), (10, "K")):
        if power >= threshold:
            return f"{1 << (power - threshold)}{suffix}"
    return str(1 << power)


def _linear_label(number: int) -> str:
    if number == 0:
        return "0"
    if number % (1 << 20) == 0:
        return f"{number // (1 << 20)}M"
    if number % (1 << 10) == 0:
        return f"{number // (1 << 10)}K"
    return str(number)


def value_text(value: Value) -> str:
    """One value on its own (the Python API's repr-like view)."""
    if isinstance(value, Count):
        return str(value.value)
    if isinstance(value, Histogram):
        return histogram_text(value)
    if isinstance(value, Latency):
        return histogram_text(value.histogram) + latency_stats(value) + "\n"
    return stacks_summary(value)
