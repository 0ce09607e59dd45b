"""Aggregations as JSON lines, one object per map, like `bpftrace -f json`.

Counts: `{"type": "map", "data": {"@name": {"k1,k2": N}}}` (a keyless map holds the number
itself); histograms: `{"type": "hist", "data": {"@name": {"key": [{"min": 2, "max": 3,
"count": 5}, ...]}}}` with bpftrace's bucket bounds (an open end has no `min`/`max`); a
latency adds `{"type": "stats", ...}` with count, average, total, min and max in its unit.
Keys join their parts with `,`; a stack part is its frames, one per line, as bpftrace writes
them. What could not be aggregated (lost events, broken pairs) follows as `{"type":
"counters", "data": {...}}`.
"""

from __future__ import annotations

import json
from typing import IO, Any

from probescope.aggregate.maps import AggregateMap, Aggregation, Key
from probescope.aggregate.render.text import part_text
from probescope.aggregate.values import Count, Histogram, Latency, Stacks


def render_json(aggregation: Aggregation, stream: IO[str], *, top: int | None = None) -> None:
    for found in aggregation.maps:
        for record in map_records(found if top is None else found.top(top)):
            stream.write(json.dumps(record) + "\n")
    if aggregation.counters:
        stream.write(json.dumps({"type": "counters", "data": dict(aggregation.counters)}) + "\n")


def map_records(aggregate_map: AggregateMap) -> list[dict[str, Any]]:
    items = aggregate_map.sorted_items()
    if not items:
        return []
    name = aggregate_map.name
    keyed = bool(aggregate_map.key_names)
    first = items[0][1]
    if isinstance(first, Count):
        counts = {json_key(k): v.value for k, v in items if isinstance(v, Count)}
        return [_record("map", name, counts if keyed else next(iter(counts.values())))]
    if isinstance(first, Histogram):
        hists = {json_key(k): buckets(v) for k, v in items if isinstance(v, Histogram)}
        return [_record("hist", name, hists if keyed else next(iter(hists.values())))]
    if isinstance(first, Latency):
        latencies = [(json_key(k), v) for k, v in items if isinstance(v, Latency)]
        hists = {k: buckets(v.histogram) for k, v in latencies}
        stats = {k: latency_stats(v) for k, v in latencies}
        return [
            _record("hist", name, hists if keyed else next(iter(hists.values()))),
            _record("stats", f"{name}_stats", stats if keyed else next(iter(stats.values()))),
        ]
    stacks = {json_key(k): v.total for k, v in items if isinstance(v, Stacks)}
    return [_record("map", name, stacks if keyed else next(iter(stacks.values())))]


def _record(kind: str, name: str, data: Any) -> dict[str, Any]:
    return {"type": kind, "data": {name: data}}


def json_key(key: Key) -> str:
    return ",".join(part_text(part) for part in key)


def buckets(histogram: Histogram) -> list[dict[str, int]]:
    out = []
    for index, count in histogram.rows():
        low, high = histogram.scale.bounds(index)
        bucket: dict[str, int] = {}
        if low is not None:
            bucket["min"] = low
        if high is not None:
            bucket["max"] = high
        bucket["count"] = count
        out.append(bucket)
    return out


def latency_stats(value: Latency) -> dict[str, int]:
    return {
        "count": value.count,
        "average": value.in_unit(value.average_ns),
        "total": value.in_unit(value.total_ns),
        "min": value.in_unit(value.min_ns),
        "max": value.in_unit(value.max_ns),
    }
