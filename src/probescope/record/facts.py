"""What a probescope recording says beyond trace-cmd's sections: `RecordingFacts`, stored as
trace.dat option 0x5053 (which trace-cmd skips) as zlib-compressed JSON.

An offline report needs it to print what the live session printed: the event types as the
session typed them (a `format` file shows `x32` as `u32` and forgets bitfields and the probe
kind: uprobe or USDT), task names and thread groups as the session read them from /proc, the
enum constants and typedefs the recorded print fmts name (from the kernel's BTF, which is
megabytes), the kernel's release and printing facts. And what viewers of user stacks need on
another machine: the probes, the memory maps of the traced processes over time, the build-ids
of the files mapped and the function symbols addresses resolve to.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from probescope.errors import RecordingError
from probescope.events import EventType
from probescope.language.model import ArgType, ProbeKind

MARK = b"probescope-recording\0"
VERSION = 1


@dataclass(frozen=True)
class EventDescription:
    """One event id of the file as the session typed it."""

    id: int
    system: str
    name: str
    kind: str
    arg_names: tuple[str, ...] = ()
    arg_types: tuple[ArgType, ...] = ()

    @classmethod
    def of(cls, event_id: int, event_type: EventType) -> EventDescription:
        return cls(
            event_id,
            event_type.group,
            event_type.name,
            str(event_type.kind),
            event_type.arg_names,
            event_type.arg_types,
        )

    @property
    def probe_kind(self) -> ProbeKind:
        return ProbeKind(self.kind)


@dataclass(frozen=True)
class MappedFile:
    """A file mapped by a traced process: its build-id and (when user stacks were recorded) its
    functions as `(file offset, size, name)`, so addresses resolve without the file."""

    path: str
    build_id: str | None = None
    functions: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True)
class ProcessMaps:
    """A traced process's executable mappings at trace-clock time `timestamp_ns`: each
    `(start, end, file offset, path)`."""

    pid: int
    timestamp_ns: int
    comm: str
    maps: tuple[tuple[int, int, int, str], ...] = ()


@dataclass
class RecordingFacts:
    """probescope's own part of a recording; every field optional for older or foreign files."""

    engine: str = ""
    release: str | None = None
    clock: str = "mono"
    hash_pointers: bool = True
    lazy_resched: bool | None = None
    irqflags_support: bool = True
    events: list[EventDescription] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    comms: dict[int, str] = field(default_factory=dict)
    tgids: dict[int, int] = field(default_factory=dict)
    enums: dict[str, int] = field(default_factory=dict)
    typedefs: dict[str, tuple[int, bool]] = field(default_factory=dict)
    processes: list[ProcessMaps] = field(default_factory=list)
    files: list[MappedFile] = field(default_factory=list)
    lost: int = 0
    notes: list[str] = field(default_factory=list)

    def to_option(self) -> bytes:
        """The option's bytes: a mark, then the facts as compressed JSON."""
        document = asdict(self)
        document["version"] = VERSION
        for event in document["events"]:
            event["arg_types"] = [_arg_type_json(t) for t in event["arg_types"]]
        text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
        return MARK + zlib.compress(text.encode("utf-8", "surrogateescape"), 6)

    @classmethod
    def from_option(cls, data: bytes) -> RecordingFacts:
        if not data.startswith(MARK):
            raise RecordingError("option 0x5053 does not hold probescope's recording facts")
        try:
            text = zlib.decompress(data[len(MARK) :]).decode("utf-8", "surrogateescape")
            document = json.loads(text)
            if document.pop("version", None) != VERSION:
                raise RecordingError("the recording's facts are of a version this reader lacks")
            return cls(
                engine=document.get("engine", ""),
                release=document.get("release"),
                clock=document.get("clock", "mono"),
                hash_pointers=bool(document.get("hash_pointers", True)),
                lazy_resched=document.get("lazy_resched"),
                irqflags_support=bool(document.get("irqflags_support", True)),
                events=[_event(item) for item in document.get("events", [])],
                probes=list(document.get("probes", [])),
                comms={int(k): v for k, v in document.get("comms", {}).items()},
                tgids={int(k): int(v) for k, v in document.get("tgids", {}).items()},
                enums={k: int(v) for k, v in document.get("enums", {}).items()},
                typedefs={
                    k: (int(v[0]), bool(v[1])) for k, v in document.get("typedefs", {}).items()
                },
                processes=[
                    ProcessMaps(p["pid"], p["timestamp_ns"], p["comm"], _quads(p["maps"]))
                    for p in document.get("processes", [])
                ],
                files=[
                    MappedFile(f["path"], f.get("build_id"), _triples(f.get("functions", [])))
                    for f in document.get("files", [])
                ],
                lost=int(document.get("lost", 0)),
                notes=list(document.get("notes", [])),
            )
        except (ValueError, KeyError, TypeError, IndexError, zlib.error) as error:
            raise RecordingError(f"the recording's facts are damaged: {error}") from None

    def describe_events(self, event_types: Mapping[int, EventType]) -> None:
        """Record how the session typed each event id."""
        self.events = [EventDescription.of(i, t) for i, t in sorted(event_types.items())]


def _arg_type_json(arg_type: Any) -> list[Any]:
    if isinstance(arg_type, ArgType):
        arg_type = asdict(arg_type)
    bitfield = arg_type["bitfield"]
    return [
        arg_type["name"],
        arg_type["base"],
        arg_type["size"],
        arg_type["signed"],
        list(bitfield) if bitfield else None,
        arg_type["count"],
    ]


def _event(item: dict[str, Any]) -> EventDescription:
    types = tuple(
        ArgType(name, base, size, bool(signed), tuple(bitfield) if bitfield else None, count)
        for name, base, size, signed, bitfield, count in item.get("arg_types", [])
    )
    return EventDescription(
        int(item["id"]),
        item["system"],
        item["name"],
        item["kind"],
        tuple(item.get("arg_names", [])),
        types,
    )


def _quads(rows: Iterable[Sequence[Any]]) -> tuple[tuple[int, int, int, str], ...]:
    return tuple((int(a), int(b), int(c), str(d)) for a, b, c, d in rows)


def _triples(rows: Iterable[Sequence[Any]]) -> tuple[tuple[int, int, str], ...]:
    return tuple((int(a), int(b), str(c)) for a, b, c in rows)
