"""Find and remove what dead probescope sessions left in tracefs: their instances first (which
disables the events enabled in them), then their dynamic-event groups."""

from __future__ import annotations

from dataclasses import dataclass, field

from probescope.engines.tracefs.dynamic_events import DynamicEvents, EventName
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.ownership import PREFIX, Owner
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import TracefsError

EVENTS_FILES = ("uprobe_events", "kprobe_events")


@dataclass
class Leftovers:
    instances: list[str] = field(default_factory=list)
    events: dict[str, list[EventName]] = field(default_factory=dict)  # by events file

    def __bool__(self) -> bool:
        return bool(self.instances) or any(self.events.values())

    def describe(self) -> list[str]:
        lines = [f"instance {name}" for name in self.instances]
        for events_file, names in self.events.items():
            lines += [f"{events_file}: {name}" for name in names]
        return lines


def _dead(name: str, include_alive: bool) -> bool:
    owner = Owner.of(name)
    if owner is None:
        return False
    return include_alive or not owner.alive()


def find_leftovers(tracefs: Tracefs, *, include_alive: bool = False) -> Leftovers:
    found = Leftovers()
    for name in tracefs.list_dir("instances"):
        if name.startswith(PREFIX) and _dead(name, include_alive):
            found.instances.append(name)
    for events_file in EVENTS_FILES:
        events = DynamicEvents(tracefs, events_file)
        if not events.available():
            continue
        names = [
            n
            for n in events.names()
            if n.group.startswith(PREFIX) and _dead(n.group, include_alive)
        ]
        if names:
            found.events[events_file] = names
    return found


def leftovers_named(tracefs: Tracefs, instance: str, group: str) -> Leftovers:
    """The instance `instance` and the events of group `group`, as far as they exist: what one
    session created, whoever owns it (the caller knows it is dead, or is the owner)."""
    found = Leftovers()
    if instance in tracefs.list_dir("instances"):
        found.instances.append(instance)
    for events_file in EVENTS_FILES:
        events = DynamicEvents(tracefs, events_file)
        if not events.available():
            continue
        names = [n for n in events.names() if n.group == group]
        if names:
            found.events[events_file] = names
    return found


def reap(tracefs: Tracefs, leftovers: Leftovers) -> list[TracefsError]:
    """Remove `leftovers`; returns what could not be removed."""
    errors: list[TracefsError] = []
    for name in leftovers.instances:
        try:
            Instance(tracefs.root / "instances" / name, name).remove()
        except TracefsError as error:
            errors.append(error)
    for events_file, names in leftovers.events.items():
        errors += DynamicEvents(tracefs, events_file).remove(names)
    return errors
