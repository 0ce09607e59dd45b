"""Install and remove dynamic events (uprobe_events/kprobe_events) in batches, with the
kernel's own reason and caret when it refuses a definition, and nothing left half-installed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import TracefsError
from probescope.language.model import ProbeSpec


@dataclass(frozen=True)
class EventName:
    group: str
    event: str

    def __str__(self) -> str:
        return f"{self.group}/{self.event}"


def event_names_in(text: str) -> list[EventName]:
    """`GROUP/EVENT` of every definition line of an events file."""
    names = []
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        _, _, name = head.partition(":")
        group, _, event = name.partition("/")
        if group and event:
            names.append(EventName(group, event))
    return names


class DynamicEvents:
    """One events file (`uprobe_events`, `kprobe_events` or `dynamic_events`) of a tracefs."""

    def __init__(self, tracefs: Tracefs, events_file: str) -> None:
        self.tracefs = tracefs
        self.events_file = events_file

    def available(self) -> bool:
        return self.tracefs.exists(self.events_file)

    def lines(self) -> list[str]:
        return self.tracefs.read(self.events_file).splitlines()

    def names(self) -> list[EventName]:
        return event_names_in(self.tracefs.read(self.events_file))

    def install(self, specs: Sequence[ProbeSpec]) -> None:
        """Define every spec in one write; on a refusal remove what was created and raise
        TracefsError with the kernel's message, the failing definition and its caret."""
        if not specs:
            return
        definitions = [spec.definition() for spec in specs]
        before = set(self.lines())
        self.tracefs.clear_error_log()
        try:
            self.tracefs.append(self.events_file, "\n".join(definitions) + "\n")
        except TracefsError as error:
            created = [line for line in self.lines() if line not in before]
            self.remove(event_names_in("\n".join(created)))
            raise self._refusal(definitions, len(created), error) from None

    def _refusal(self, definitions: list[str], created: int, error: TracefsError) -> TracefsError:
        failed = definitions[min(created, len(definitions) - 1)]
        entries = self.tracefs.error_log()
        entry = entries[-1] if entries else None
        if entry is not None and entry.command is not None:
            return TracefsError(
                f"the kernel refused the definition: {entry.message}",
                command=entry.command,
                column=entry.column,
                hint=_hint_for(entry.message),
            )
        return TracefsError(
            f"the kernel refused the definition ({error.message.rsplit(': ', 1)[-1]})",
            command=failed,
            hint="the kernel logged no reason; check the path and offset",
        )

    def remove(self, names: Sequence[EventName]) -> list[TracefsError]:
        """Remove events; returns the errors of those that could not be removed (EBUSY while
        still enabled somewhere) instead of stopping at the first."""
        errors: list[TracefsError] = []
        if not names:
            return errors
        try:
            self.tracefs.append(self.events_file, "".join(f"-:{n}\n" for n in names))
            return errors
        except TracefsError:
            pass
        present = set(self.names())
        for name in names:
            if name not in present:
                continue
            try:
                self.tracefs.append(self.events_file, f"-:{name}\n")
            except TracefsError as error:
                errors.append(error)
        return errors

    def remove_group(self, group: str) -> list[TracefsError]:
        return self.remove([n for n in self.names() if n.group == group])


def _hint_for(message: str) -> str | None:
    lowered = message.lower()
    if "failed to find the given file" in lowered:
        return "the path must exist in probescope's own mount namespace (use /proc/PID/root/...)"
    if "already exists" in lowered or "exist" in lowered:
        return "an event with this name exists; choose another name or run `probescope cleanup`"
    return None
