"""The kernel's own per-probe counters: `uprobe_profile` (hits in every process, before pid
filtering) and `kprobe_profile` (hits and misses), for the session's summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from probescope.engines.tracefs.dynamic_events import EventName
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import TracefsError
from probescope.events import EventType

PROFILES = (("uprobe_events", "uprobe_profile"), ("kprobe_events", "kprobe_profile"))
"""The profile file of each events file."""


def read_profiles(
    tracefs: Tracefs,
    installed: Mapping[str, Sequence[EventName]],
    types: Mapping[str, EventType],
) -> tuple[dict[str, int], dict[str, int]]:
    """(hits, misses) by "group/event" of the session's `installed` events (by events file),
    named after the EventType of each event name."""
    hits: dict[str, int] = {}
    misses: dict[str, int] = {}
    ours = {name.event for names in installed.values() for name in names}
    for events_file, profile in PROFILES:
        if events_file not in installed or not tracefs.exists(profile):
            continue
        try:
            text = tracefs.read(profile)
        except TracefsError:
            continue
        for line in text.splitlines():
            words = line.split()
            counts = [w for w in words if w.isdigit()]
            names = [w for w in words if w in ours]
            if not names or not counts:
                continue
            event_type = types.get(names[-1])
            if event_type is None:
                continue
            key = f"{event_type.group}/{event_type.name}"
            if profile == "kprobe_profile" and len(counts) >= 2:
                hits[key] = int(counts[-2])
                misses[key] = int(counts[-1])
            else:
                hits[key] = hits.get(key, 0) + int(counts[-1])
    return hits, misses
