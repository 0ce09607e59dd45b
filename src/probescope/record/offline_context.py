"""The `KernelContext` of a recording, built from the file alone: no /proc, /sys or tracefs.

Formats, the sub-buffer layout, kallsyms, printk strings and task names come from trace-cmd's
sections; the release comes from probescope's facts or trace-cmd's UNAME option; enum constants
and typedefs from probescope's facts (a trace-cmd file has none: its print fmts print what they
can without). ftrace's stack records are read as running to the end of each record, as the
live engine reads them.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from probescope.errors import RingBufferFormatError
from probescope.record.facts import RecordingFacts
from probescope.record.tracedat import OPTION_UNAME, TraceDat
from probescope.traceevent.btf import KernelTypes
from probescope.traceevent.context import KernelContext, kernel_has_lazy_resched_flag
from probescope.traceevent.format import (
    EventFormat,
    parse_event_format,
    parse_header_event,
    parse_header_page,
    parse_saved_cmdlines,
)
from probescope.traceevent.kallsyms import KernelSymbols
from probescope.traceevent.printk_formats import parse_printk_formats

STACK_RECORDS = {"kernel_stack": "caller", "user_stack": "caller"}
"""ftrace records whose last array holds as many entries as the record has room for."""
_ID_LINE = re.compile(rb"^ID:\s*(\d+)", re.MULTILINE)


def recording_context(
    dat: TraceDat, facts: RecordingFacts | None = None, *, event_ids: Iterable[int] | None = None
) -> KernelContext:
    """What decoding and printing the recording's events needs, from `dat` and its `facts`;
    with `event_ids`, only the formats of those events are parsed (a trace-cmd file carries
    the formats of every event of the kernel)."""
    facts = facts or RecordingFacts()
    values: dict[str, Any] = {"byteorder": dat.byteorder}
    if dat.header_page:
        values["header_page"] = parse_header_page(_text(dat.header_page))
    if dat.header_event:
        values["header_event"] = parse_header_event(_text(dat.header_event))
    formats, refused = recording_formats(dat, event_ids)
    values["formats"] = formats
    values["refused_formats"] = refused
    if dat.kallsyms.strip():
        values["symbols"] = RecordedKernelSymbols(dat.kallsyms)
    if dat.printk_formats.strip():
        values["strings"] = parse_printk_formats(_text(dat.printk_formats))
    comms = parse_saved_cmdlines(dat.saved_cmdlines)
    comms.update(facts.comms)
    values["comms"] = comms
    values["tgids"] = dict(facts.tgids)
    if facts.enums or facts.typedefs:
        values["types"] = KernelTypes(facts.enums, facts.typedefs)
    values["hash_pointers"] = facts.hash_pointers
    values["irqflags_support"] = facts.irqflags_support
    release = facts.release or _uname_release(dat)
    if facts.lazy_resched is not None:
        values["lazy_resched"] = facts.lazy_resched
    elif release is not None:
        values["lazy_resched"] = kernel_has_lazy_resched_flag(release)
    return KernelContext(release=release, **values)


def format_texts(dat: TraceDat) -> dict[int, tuple[str, bytes]]:
    """The file's format files by event id (their `ID:` line), unparsed: (system, text)."""
    texts: dict[int, tuple[str, bytes]] = {}
    for system, text in [("ftrace", t) for t in dat.ftrace_formats] + list(dat.event_formats):
        match = _ID_LINE.search(text)
        if match:
            texts.setdefault(int(match.group(1)), (system, text))
    return texts


class RecordedKernelSymbols(KernelSymbols):
    """A recording's kallsyms, parsed on first use: a trace-cmd file carries them whatever it
    recorded, and most reports (uprobes, tracepoints without `%pS`) never look one up."""

    def __init__(self, data: bytes) -> None:
        self._text = data

    def __getattr__(self, name: str) -> Any:
        if name == "_text":
            raise AttributeError(name)
        KernelSymbols.__init__(self, io.BytesIO(self._text))
        return getattr(self, name)


def recording_formats(
    dat: TraceDat, event_ids: Iterable[int] | None = None
) -> tuple[tuple[EventFormat, ...], dict[str, str]]:
    """The event formats of the file (those of `event_ids` only, when given) that parse; the
    others by `system/name` with why."""
    texts = format_texts(dat)
    wanted = sorted(texts) if event_ids is None else sorted(set(event_ids) & texts.keys())
    formats: list[EventFormat] = []
    refused: dict[str, str] = {}
    for event_id in wanted:
        system, text = texts[event_id]
        try:
            formats.append(parse_recorded_format(system, text))
        except RingBufferFormatError as error:
            refused[f"{system}/{_name_of(text)}"] = error.message
    return tuple(formats), refused


def parse_recorded_format(system: str, text: bytes) -> EventFormat:
    """One format file of a recording, ftrace's stack records read to the end of the record."""
    event_format = parse_event_format(_text(text), system=system)
    if system == "ftrace" and event_format.name in STACK_RECORDS:
        event_format = open_tail(event_format, STACK_RECORDS[event_format.name])
    return event_format


def open_tail(event_format: EventFormat, field_name: str) -> EventFormat:
    """An ftrace record format whose last array runs to the end of each record (the `format`
    file shows a fixed length)."""
    fields = tuple(
        replace(f, size=0, array_length=None) if f.name == field_name else f
        for f in event_format.fields
    )
    return replace(event_format, fields=fields)


def _uname_release(dat: TraceDat) -> str | None:
    """The release in trace-cmd's UNAME option (`sysname nodename release version machine`)."""
    text = dat.option_text(OPTION_UNAME)
    if not text:
        return None
    words = text.split()
    return words[2] if len(words) > 2 else None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _name_of(text: bytes) -> str:
    for line in _text(text).splitlines():
        if line.startswith("name:"):
            return line[5:].strip()
    return "?"
