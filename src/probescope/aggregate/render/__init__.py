"""Renderers of aggregated values: bpftrace-style text and JSON, folded stacks, speedscope,
and an interactive SVG flame graph. They read values only (never events or the live system),
so a live run, a recording's report or a bpf engine's maps render alike."""

from __future__ import annotations

from typing import IO

from probescope.aggregate.maps import Aggregation
from probescope.aggregate.values import Stacks

STACK_FORMATS = {
    ".svg": "svg",
    ".folded": "folded",
    ".speedscope.json": "speedscope",
    ".speedscope": "speedscope",
}


def stack_format_of(path: str) -> str | None:
    """The stack format a file name asks for by its suffix, or None."""
    for suffix, name in STACK_FORMATS.items():
        if path.endswith(suffix):
            return name
    return None


def render_stacks(
    aggregation: Aggregation,
    stream: IO[str],
    output_format: str,
    *,
    title: str = "Flame Graph",
) -> None:
    """The first map's stacks (and, for speedscope, the timed calls) in `output_format`."""
    stacks: Stacks | None = aggregation.first.stacks() if aggregation.maps else None
    if output_format == "svg":
        from probescope.aggregate.render.flamegraph import render_flamegraph

        render_flamegraph(stacks or Stacks(), stream, title=title)
    elif output_format == "folded":
        from probescope.aggregate.render.folded import render_folded

        render_folded(stacks or Stacks(), stream)
    else:
        from probescope.aggregate.render.speedscope import render_speedscope

        has_stacks = aggregation.maps and any(
            n in ("ustack", "kstack") for n in aggregation.first.key_names
        )
        render_speedscope(stream, stacks if has_stacks else None, aggregation.spans, name=title)
