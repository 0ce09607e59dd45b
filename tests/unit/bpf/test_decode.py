"""Ring-buffer spans to Events, from hand-built bytes: the ring's 8-byte record headers (length
with the BUSY and DISCARD bits, page offset), the engine's 56-byte record header, and the
arguments laid out as `record.layout_for` says."""

from __future__ import annotations

import struct

import pytest

from probescope.engines.bpf.decode import RecordDecoder
from probescope.engines.bpf.record import HEADER, HEADER_SIZE, layout_for
from probescope.errors import RingBufferFormatError
from probescope.events import EventType
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import ProbeKind, ProbeSpec

BUSY = 1 << 31
DISCARD = 1 << 30


def spec(text: str) -> ProbeSpec:
    parsed = parse_kernel_probe(
        f"p:g/e /bin/true:0x10 {text}", events_file=EventsFile.UPROBE_EVENTS
    )
    assert isinstance(parsed, ProbeSpec)
    return parsed


def header(index: int, *, ts: int = 1000, ip: int = 0x401000, ret_ip: int = 0) -> bytes:
    return HEADER.pack(ts, ip, ret_ip, 42, 41, index, 1, b"prog\0" + b"\0" * 11)


def ring_record(body: bytes, flags: int = 0) -> bytes:
    padded = body + b"\0" * (-len(body) % 8)
    return struct.pack("<II", len(body) | flags, 0) + padded


def event_type(probe: ProbeSpec, kind: ProbeKind = ProbeKind.UPROBE) -> EventType:
    return EventType(
        "g", "e", kind, tuple(a.name for a in probe.args), tuple(a.type for a in probe.args)
    )


def test_numbers_chars_arrays_and_strings() -> None:
    probe = spec('a=%di:s8 b=%si:x16 c=+0(%dx):char[3] d=+0(%cx):string e=\\"x":string f=%r8:u64')
    layout = layout_for(probe.args)
    decoder = RecordDecoder()
    decoder.add(0, event_type(probe), is_return=False, layout=layout)
    strings_at = layout.strings_offset
    body = header(0) + struct.pack(
        "<bH3sIIQ",
        -3,
        0xBEEF,
        b"hey",
        (6 << 16) | strings_at,  # "hello" and its NUL
        (0 << 16) | (strings_at + 6),  # a fault
        2**64 - 1,
    )
    body += b"hello\0"
    walked = decoder.walk(ring_record(body))
    (event,) = walked.events
    assert event.args == (-3, 0xBEEF, ("h", "e", "y"), "hello", None, 2**64 - 1)
    assert (event.pid, event.tid, event.cpu, event.comm) == (41, 42, 1, "prog")
    assert (event.ip, event.ret_ip, event.flags, event.preempt_count) == (0x401000, None, 0, 0)
    assert walked.consumed == len(ring_record(body))


def test_returns_keep_the_return_address() -> None:
    probe = spec("")
    decoder = RecordDecoder()
    decoder.add(3, event_type(probe, ProbeKind.URETPROBE), is_return=True, layout=layout_for(()))
    (event,) = decoder.walk(ring_record(header(3, ip=0x1000, ret_ip=0x2345))).events
    assert (event.ip, event.ret_ip, event.args) == (0x1000, 0x2345, ())


def test_busy_records_stop_the_walk_and_discarded_ones_are_skipped() -> None:
    decoder = RecordDecoder()
    decoder.add(0, event_type(spec("")), is_return=False, layout=layout_for(()))
    first = ring_record(header(0, ts=1))
    skipped = ring_record(header(0, ts=2), DISCARD)
    busy = ring_record(header(0, ts=3), BUSY)
    walked = decoder.walk(first + skipped + busy)
    assert [e.timestamp_ns for e in walked.events] == [1]
    assert walked.discarded == 1
    assert walked.consumed == len(first) + len(skipped)


def test_a_record_cut_short_waits_for_the_rest() -> None:
    decoder = RecordDecoder()
    decoder.add(0, event_type(spec("")), is_return=False, layout=layout_for(()))
    whole = ring_record(header(0))
    walked = decoder.walk(whole + whole[:20])
    assert len(walked.events) == 1 and walked.consumed == len(whole)


def test_unknown_probe_index_is_an_error() -> None:
    decoder = RecordDecoder()
    decoder.add(0, event_type(spec("")), is_return=False, layout=layout_for(()))
    with pytest.raises(RingBufferFormatError, match="probe index 9"):
        decoder.walk(ring_record(header(9)))


def test_comm_names_are_decoded_once_and_keep_undecodable_bytes() -> None:
    decoder = RecordDecoder()
    decoder.add(0, event_type(spec("")), is_return=False, layout=layout_for(()))
    raw = HEADER.pack(1, 0, 0, 1, 1, 0, 0, b"caf\xe9\0" + b"\0" * 11)
    (event,) = decoder.walk(ring_record(raw)).events
    assert event.comm.encode("utf-8", "surrogateescape") == b"caf\xe9"
    assert HEADER_SIZE == 56


def test_layouts_with_the_same_bytes_but_other_types_stay_apart() -> None:
    number, letter = spec("v=%di:u8"), spec("v=%di:char")
    decoder = RecordDecoder()
    decoder.add(0, event_type(number), is_return=False, layout=layout_for(number.args))
    decoder.add(1, event_type(letter), is_return=False, layout=layout_for(letter.args))
    span = ring_record(header(0) + b"A") + ring_record(header(1) + b"A")
    assert [e.args for e in decoder.walk(span).events] == [(65,), ("A",)]


def test_runs_of_one_layout_resume_after_a_discarded_record() -> None:
    probe = spec("n=%di:s32")
    decoder = RecordDecoder()
    decoder.add(0, event_type(probe), is_return=False, layout=layout_for(probe.args))

    def hit(n: int, flags: int = 0) -> bytes:
        return ring_record(header(0, ts=n) + struct.pack("<i", n), flags)

    span = b"".join(hit(n) for n in range(3)) + hit(99, DISCARD) + hit(3) + hit(4) + hit(5, BUSY)
    walked = decoder.walk(span)
    assert [e.args[0] for e in walked.events] == [0, 1, 2, 3, 4]
    assert walked.discarded == 1
    assert walked.consumed == len(span) - len(hit(5))
