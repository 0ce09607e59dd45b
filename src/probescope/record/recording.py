"""`Recording`: a trace.dat read back as an engine streams a live session — `EventBatch`es in
the order the kernel's `trace` prints them — so every sink and aggregation reads a file the way
it reads a live session.

Events are typed as the recording session typed them when probescope wrote the file (its
facts), else from the formats alone, as any trace-cmd file is read: probe events by their
print fmt, tracepoints by their fields, kprobes by their `kprobes` system, ftrace's records as
the function tracer's. Records of events the file has no format for are counted in `skipped`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from probescope.errors import RecordingError, RingBufferFormatError
from probescope.events import EventBatch, EventType
from probescope.language.model import ProbeKind
from probescope.record.facts import EventDescription, RecordingFacts
from probescope.record.offline_context import (
    format_texts,
    parse_recorded_format,
    recording_context,
)
from probescope.record.tracedat import OPTION_PROBESCOPE, OPTION_UNAME, TraceBuffer, TraceDat
from probescope.traceevent.accel import RawCpuStream
from probescope.traceevent.context import KernelContext
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.event_layout import EventLayout
from probescope.traceevent.format import EventFormat
from probescope.traceevent.merge import merge_cpu_batches
from probescope.traceevent.ringbuffer import split_sub_buffers


class Recording:
    """A recording opened for reading (`Recording.from_path(path)`; close it, or use `with`).

    `facts` is probescope's part of the file (empty for trace-cmd's files), `context` the
    KernelContext to give sinks, `clock` the trace clock, `event_types` the EventType of each
    event id; `batches()` streams the events. `refused` names the formats that could not be
    read (their records are then counted in `skipped`, by event id).
    """

    def __init__(self, dat: TraceDat) -> None:
        if dat.latency:
            raise RecordingError(
                "the file holds a latency tracer's text, not ring-buffer data",
                hint="trace-cmd report reads it",
            )
        self.dat = dat
        option = dat.option(OPTION_PROBESCOPE)
        self.facts = RecordingFacts.from_option(option) if option else RecordingFacts()
        self._descriptions = {event.id: event for event in self.facts.events}
        # probescope's files hold the formats of their events only; trace-cmd's hold every
        # event of the kernel, so those are parsed when a record of theirs first shows up.
        self._format_texts = format_texts(dat)
        self.context: KernelContext = recording_context(
            dat, self.facts, event_ids=self._descriptions
        )
        self._untried = set(self._format_texts) - {f.id for f in self.context.formats}
        self.clock = dat.trace_clock or self.facts.clock
        self._decoders: dict[int, EventDecoder] = {}
        self.event_types: dict[int, EventType] = {}
        self.skipped: dict[int, int] = {}
        self.refused: dict[str, str] = dict(self.context.refused_formats)

    @classmethod
    def from_path(cls, path: str | Path) -> Recording:
        dat = TraceDat.from_path(path)
        try:
            return cls(dat)
        except BaseException:
            dat.close()
            raise

    def close(self) -> None:
        self.dat.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def written_by_probescope(self) -> bool:
        return bool(self.facts.engine)

    def decoder(self, page_size: int) -> EventDecoder:
        """The decoder of sub-buffers of `page_size` bytes (one per size: instances may differ),
        with every format of the file, typed as the recording session typed them."""
        decoder = self._decoders.get(page_size)
        if decoder is not None:
            return decoder
        decoder = EventDecoder(
            self.context.layout(page_size),
            comms=self.context.comms,
            tgids=self.context.tgids,
            strict=False,
        )
        decoder.skipped = self.skipped
        for event_format in self.context.formats:
            self._add(decoder, event_format)
        self._decoders[page_size] = decoder
        return decoder

    def _add(self, decoder: EventDecoder, event_format: EventFormat) -> None:
        event_type = self.event_types.get(event_format.id)
        kind, event_type = self._typing(event_format, event_type)
        try:
            self.event_types[event_format.id] = decoder.add_event(
                event_format,
                kind=kind,
                group=event_format.system,
                event_type=event_type,
            )
        except RingBufferFormatError as error:  # a format the decoder refuses: say so
            self.refused[event_format.label] = error.message

    def _learn(self, event_ids: Iterable[int]) -> bool:
        """Parse and add the formats of `event_ids` not tried yet; whether any was added."""
        added = []
        for event_id in sorted(set(event_ids) & self._untried):
            self._untried.discard(event_id)
            system, text = self._format_texts[event_id]
            try:
                added.append(parse_recorded_format(system, text))
            except RingBufferFormatError as error:
                self.refused[f"{system}/{event_id}"] = error.message
        if not added:
            return False
        self.context = self.context.with_formats(added)
        for decoder in self._decoders.values():
            for event_format in added:
                self._add(decoder, event_format)
        return True

    def _typing(
        self, event_format: EventFormat, known: EventType | None
    ) -> tuple[ProbeKind | None, EventType | None]:
        """The kind of an event id's records and, when the file says, its EventType."""
        description = self._descriptions.get(event_format.id)
        if known is not None:
            return known.kind, known
        if description is not None and description.name == event_format.name:
            return description.probe_kind, _event_type(description, event_format)
        system = event_format.system or ""
        if system == "ftrace":
            return ProbeKind.FUNCTION, None
        probe_layout = event_format.has_field("__probe_ip") or event_format.has_field(
            "__probe_ret_ip"
        )
        if probe_layout and system.startswith("kprobes"):
            returns = event_format.has_field("__probe_ret_ip")
            return (ProbeKind.KRETPROBE if returns else ProbeKind.KPROBE), None
        return None, None

    def batches(self) -> Iterator[EventBatch]:
        """Every event of every buffer, merged across CPUs in the order `trace` prints them;
        a batch's `lost` is what the kernel lost just before it."""
        streams = [
            self._cpu_stream(buffer, index)
            for buffer in self.dat.buffers
            for index in range(len(buffer.cpus))
            if buffer.cpus[index].size
        ]
        yield from merge_cpu_batches(streams)

    def raw_streams(self) -> list[RawCpuStream]:
        """The undecoded data of every CPU of every buffer, as `batches()` merges it (for the
        compiled report loop, `sinks/text_program.py`)."""
        return [
            RawCpuStream(
                buffer.cpus[index].cpu,
                self.decoder(buffer.page_size),
                self._cpu_chunks(buffer, index),
            )
            for buffer in self.dat.buffers
            for index in range(len(buffer.cpus))
            if buffer.cpus[index].size
        ]

    def event_layout(self, event_id: int) -> EventLayout | None:
        """How records of `event_id` decode, learning the event's format from the file first if
        it was not read yet; None for records `batches()` leaves out (counted in `skipped`)."""
        decoder = self.decoder(self.dat.page_size)
        layout = decoder.layout_of(event_id)
        if layout is None and event_id in self._untried and self._learn([event_id]):
            layout = decoder.layout_of(event_id)
        return layout

    def _cpu_chunks(self, buffer: TraceBuffer, index: int) -> Iterator[bytes]:
        """One CPU's data in whole sub-buffers; a partial sub-buffer at its end is an error."""
        cpu = buffer.cpus[index]
        size = self.decoder(buffer.page_size).layout.size
        carry = b""
        for run in self.dat.sub_buffers(buffer, cpu):
            data = carry + run if carry else run
            whole = len(data) - len(data) % size
            carry = data[whole:]
            yield data[:whole] if carry else data
        if carry.strip(b"\0"):
            raise RecordingError(
                f"cpu {cpu.cpu}: the data ends with {len(carry)} bytes, not a whole "
                f"{size}-byte sub-buffer"
            )

    def _cpu_stream(self, buffer: TraceBuffer, index: int) -> Iterator[EventBatch]:
        cpu = buffer.cpus[index]
        decoder = self.decoder(buffer.page_size)
        layout = decoder.layout
        for data in self._cpu_chunks(buffer, index):
            skipped = self.skipped
            for sub_buffer in split_sub_buffers(layout, data):
                before = dict(skipped) if self._untried else None
                batch = decoder.decode(sub_buffer, cpu.cpu)
                if before is not None and skipped != before:
                    fresh = [i for i, n in skipped.items() if n != before.get(i, 0)]
                    if self._learn(fresh):
                        skipped.clear()
                        skipped.update(before)
                        batch = decoder.decode(sub_buffer, cpu.cpu)
                yield batch

    def known_event_types(self) -> list[EventType]:
        """The event types the file describes before any record is read: a probescope file's
        (its facts), else none (a trace-cmd file's are learned as records show up)."""
        if not self._descriptions:
            return []
        return list(self.decoder(self.dat.page_size).event_types.values())

    @property
    def host(self) -> str:
        """The recording machine's host name (trace-cmd's UNAME option), or empty."""
        words = (self.dat.option_text(OPTION_UNAME) or "").split()
        return words[1] if len(words) > 1 else ""

    def events_total(self) -> int:
        """How many events the file holds (decodes it all)."""
        return sum(len(batch.events) for batch in self.batches())


def _event_type(description: EventDescription, event_format: EventFormat) -> EventType:
    kind = description.probe_kind
    return EventType(
        group=description.system,
        name=description.name,
        kind=kind,
        arg_names=description.arg_names,
        arg_types=description.arg_types,
        system=description.system if kind is ProbeKind.TRACEPOINT else None,
        fields=tuple(f.name for f in event_format.fields),
        format=event_format,
    )
