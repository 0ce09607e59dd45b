"""The one record every engine emits (Event) and the bulk container (EventBatch).

An Event points at a shared EventType that holds what is the same for every hit of one event
(group, name, kind, argument names and types), so a hit costs one small tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from probescope.language.model import ArgType, ProbeKind, ProbeSpec

HIDDEN_PREFIX = "__ps_"
"""Names of the arguments probescope fetches for itself (an aggregation's return value or stack
pointer, the return address a recorded stack lacks): in the records, never in printed events."""


@dataclass(frozen=True, eq=False)
class EventType:
    """What all hits of one event share. Identity matters: engines create one per event."""

    group: str
    name: str
    kind: ProbeKind
    arg_names: tuple[str, ...] = ()
    arg_types: tuple[ArgType, ...] = ()
    system: str | None = None  # tracepoints: the events/ subsystem, which is the group
    fields: tuple[str, ...] = field(default=(), compare=False)
    # The kernel's description of the record (a traceevent.format.EventFormat) when the events
    # came from trace events: what a printer needs to print them as the kernel does (the text
    # sink evaluates a tracepoint's `print fmt` from it). The decoder sets it; it is how the
    # formats of a session's events reach its sinks, with no registry in between.
    format: Any = field(default=None, compare=False)

    def shown_arguments(self) -> list[tuple[int, str, ArgType]]:
        """(index in an event's args, name, type) of the arguments sinks print: all but the
        hidden ones (HIDDEN_PREFIX)."""
        return [
            (index, name, arg_type)
            for index, (name, arg_type) in enumerate(
                zip(self.arg_names, self.arg_types, strict=False)
            )
            if not name.startswith(HIDDEN_PREFIX)
        ]

    @classmethod
    def of_probe(
        cls,
        spec: ProbeSpec,
        kind: ProbeKind | None = None,
        *,
        group: str | None = None,
        name: str | None = None,
        fields: tuple[str, ...] = (),
        format: Any = None,
    ) -> EventType:
        """The EventType of a dynamic probe's events: the names and types of the spec's
        arguments, its group and event name (or `group` and `name`, those it was installed
        under), and `kind` (default the spec's: a resolved probe may say usdt where the spec
        says uprobe). `fields` and `format` are what its `format` file says, when known."""
        return cls(
            group=group or spec.group_name,
            name=name or spec.event_name,
            kind=kind or spec.kind,
            arg_names=tuple(arg.name for arg in spec.args),
            arg_types=tuple(arg.type for arg in spec.args),
            fields=fields,
            format=format,
        )


class Event(NamedTuple):
    """One hit of one probe.

    `ip` is the probed address for entries and the function address for returns; `ret_ip` is
    the return address in the caller (returns only). `args` holds decoded values in spec order:
    int for integer types, str for strings (None when the read faulted), tuple for arrays.
    `flags` and `preempt_count` are the kernel's `common_flags`/`common_preempt_count`.
    """

    timestamp_ns: int
    cpu: int
    pid: int
    tid: int
    comm: str
    type: EventType
    ip: int = 0
    ret_ip: int | None = None
    args: tuple[Any, ...] = ()
    flags: int = 0
    preempt_count: int = 0

    @property
    def group(self) -> str:
        return self.type.group

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def kind(self) -> ProbeKind:
        return self.type.kind

    def arg(self, name: str) -> Any:
        return self.args[self.type.arg_names.index(name)]

    def arg_dict(self) -> dict[str, Any]:
        return dict(zip(self.type.arg_names, self.args, strict=False))


@dataclass
class EventBatch:
    """Events decoded together (one ring-buffer page, one ptrace wakeup), in time order,
    with the count of events the source lost just before them."""

    events: list[Event]
    lost: int = 0
    cpu: int | None = None

    def __len__(self) -> int:
        return len(self.events)
