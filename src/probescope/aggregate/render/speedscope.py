"""Stacks and timed calls as a speedscope profile (https://www.speedscope.app/file-format-schema.json).

Weighted stacks become one `sampled` profile (weights in samples, or nanoseconds for a latency);
timed calls (latency with `keep_spans`) become one `evented` profile per thread, in which each
call opens its stack's frames at its entry and closes them at its return, so the time-order view
shows when each call ran and how long it took. Frames are shared between profiles.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import IO, Any

from probescope import __version__
from probescope.aggregate.maps import Span
from probescope.aggregate.render.folded import frame_name
from probescope.aggregate.values import Frame, Stacks

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


class _Frames:
    def __init__(self) -> None:
        self.index: dict[tuple[str, str], int] = {}
        self.frames: list[dict[str, str]] = []

    def __call__(self, frame: Frame) -> int:
        name = frame_name(frame)
        key = (name, frame.module)
        number = self.index.get(key)
        if number is None:
            number = self.index[key] = len(self.frames)
            entry = {"name": name}
            if frame.module and not frame.module.startswith("["):
                entry["file"] = frame.module
            self.frames.append(entry)
        return number


def speedscope_document(
    stacks: Stacks | None = None,
    spans: Sequence[Span] = (),
    *,
    name: str = "probescope",
) -> dict[str, Any]:
    frames = _Frames()
    profiles: list[dict[str, Any]] = []
    if stacks is not None and len(stacks):
        samples = []
        weights = []
        for stack, weight in sorted(stacks, key=lambda item: [f.function for f in item[0][::-1]]):
            samples.append([frames(frame) for frame in reversed(stack)])
            weights.append(weight)
        total = sum(weights)
        profiles.append(
            {
                "type": "sampled",
                "name": name,
                "unit": "nanoseconds" if stacks.unit == "ns" else "none",
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            }
        )
    profiles += _evented_profiles(spans, frames)
    return {
        "$schema": SCHEMA,
        "shared": {"frames": frames.frames},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": f"probescope {__version__}",
    }


def _evented_profiles(spans: Sequence[Span], frames: _Frames) -> list[dict[str, Any]]:
    by_thread: dict[tuple[int, int, str], list[Span]] = {}
    for span in spans:
        by_thread.setdefault((span.pid, span.tid, span.comm), []).append(span)
    profiles = []
    for (pid, tid, comm), calls in sorted(by_thread.items()):
        events = _nested_events(calls, frames)
        if not events:
            continue
        profiles.append(
            {
                "type": "evented",
                "name": f"{comm}-{tid} (pid {pid})",
                "unit": "nanoseconds",
                "startValue": events[0]["at"],
                "endValue": events[-1]["at"],
                "events": events,
            }
        )
    return profiles


def _nested_events(calls: list[Span], frames: _Frames) -> list[dict[str, Any]]:
    """Open/close events of one thread's calls. Calls of one thread nest (a call that starts
    inside another ends inside it); the innermost call running decides the open frames, and
    moving from one set of open frames to the next closes and opens only what differs."""
    points: list[tuple[int, int, int]] = []  # (time, 0 = end / 1 = start, call number)
    for number, call in enumerate(calls):
        points.append((call.start_ns, 1, number))
        points.append((call.end_ns, 0, number))
    points.sort(key=lambda p: (p[0], p[1], -p[2] if p[1] == 0 else p[2]))
    running: list[int] = []
    opened: list[int] = []
    events: list[dict[str, Any]] = []
    for at, is_start, number in points:
        if is_start:
            running.append(number)
        elif number in running:
            running.remove(number)
        innermost = calls[running[-1]] if running else None
        wanted: list[int] = []
        if innermost is not None and innermost.stack:
            wanted = [frames(frame) for frame in reversed(innermost.stack)]
            if frame_name(innermost.stack[0]) != innermost.probe:
                wanted.append(frames(Frame(innermost.probe)))
        elif innermost is not None:
            # no stacks: one frame per call in progress, so recursion shows as nesting
            wanted = [frames(Frame(calls[n].probe)) for n in running]
        common = 0
        while common < min(len(opened), len(wanted)) and opened[common] == wanted[common]:
            common += 1
        for frame in reversed(opened[common:]):
            events.append({"type": "C", "frame": frame, "at": at})
        for frame in wanted[common:]:
            events.append({"type": "O", "frame": frame, "at": at})
        opened = wanted
    return events


def render_speedscope(
    stream: IO[str],
    stacks: Stacks | None = None,
    spans: Sequence[Span] = (),
    *,
    name: str = "probescope",
) -> None:
    json.dump(speedscope_document(stacks, spans, name=name), stream)
    stream.write("\n")
