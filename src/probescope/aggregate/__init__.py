"""Aggregations: the value model (counts, histograms, latency, stacks), keys, the user-space
aggregators over any engine's events, latency pairing, stack capture, unwinding and
symbolization, and the renderers of values (`aggregate.render`).

Running one over a live session is `probescope.aggregations` (one layer up, beside the
session it drives).
"""

from probescope.aggregate.maps import AggregateMap, Aggregation, Span
from probescope.aggregate.values import (
    Count,
    Frame,
    Histogram,
    Latency,
    LinearScale,
    Log2Scale,
    Stack,
    Stacks,
)

__all__ = [
    "AggregateMap",
    "Aggregation",
    "Count",
    "Frame",
    "Histogram",
    "Latency",
    "LinearScale",
    "Log2Scale",
    "Span",
    "Stack",
    "Stacks",
]
