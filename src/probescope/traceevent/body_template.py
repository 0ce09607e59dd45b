"""`BodyTemplate`: an event's text as one %-format filled by Python expressions over the Event,
the shape in which printers (the print fmt compiler, the text sink's probe printers) hand an
event's text to the text sink, which fuses it with the context columns into one compiled
function per event type."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from probescope.events import Event

Printer = Callable[[Event], str]
"""An event's text as a function of the Event."""


@dataclass(frozen=True)
class BodyTemplate:
    """An event's text as one %-format: `template % (values...)`, each value a Python
    expression over `e` (the Event tuple: derive its indices from `Event._fields`) that may
    call `helpers`.

    Printer factories return this so the sink can fuse context and event text into a single
    compiled format per event type; a factory may instead return any `Event -> str` callable.
    """

    template: str
    values: tuple[str, ...]
    helpers: Mapping[str, Any] = field(default_factory=dict)

    def compile(self, name: str) -> Printer:
        """This body as a function of the event (for callers that want the text alone)."""
        namespace: dict[str, Any] = dict(self.helpers)
        values = "".join(f"{value}, " for value in self.values)
        source = f"def body(e):\n    return {self.template!r} % ({values})\n"
        exec(compile(source, f"<probescope text body {name}>", "exec"), namespace)
        printer: Printer = namespace["body"]
        return printer
