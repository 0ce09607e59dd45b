"""Records made for engines without a ring buffer decode back to the events they were made
from: every argument kind, entries and returns, long gaps (TIME_EXTEND), sub-buffer breaks,
losses; and the synthesized format is the kernel's layout of a uprobe event."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from probescope.events import Event, EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.record.synthesis import (
    EventEncoder,
    SubBufferPacker,
    format_text,
    probe_format_text,
)
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.format import parse_event_format
from probescope.traceevent.ringbuffer import SubBufferLayout

ENTRY = EventType(
    "uprobes",
    "work",
    ProbeKind.UPROBE,
    ("n", "u", "x", "c", "s", "arr", "names", "b"),
    (
        ArgType("s64", "s64", 8, True),
        ArgType("u8", "u8", 1, False),
        ArgType("x32", "x32", 4, False),
        ArgType("char", "char", 1, False),
        ArgType("string", "string", 4, False),
        ArgType("s16[3]", "s16", 2, True, count=3),
        ArgType("string[2]", "string", 4, False, count=2),
        ArgType("b4@2/32", "u32", 4, False, (4, 2, 32)),
    ),
)
RETURN = EventType(
    "uprobes", "work__return", ProbeKind.URETPROBE, ("ret",), (ArgType("x64", "x64", 8, False),)
)
USDT = EventType("sdt", "mark", ProbeKind.USDT, ("v",), (ArgType("s32", "s32", 4, True),))


def decode(encoder: EventEncoder, pages: list[bytes]) -> list[Event]:
    decoder = EventDecoder(SubBufferLayout(), comms={11: "w"}, tgids={11: 10})
    for system, text in encoder.formats:
        event_format = parse_event_format(text, system=system)
        event_type = encoder.event_types[event_format.id]
        decoder.add_event(event_format, kind=event_type.kind, event_type=event_type)
    return [e for page in pages for e in decoder.decode(page, 1).events]


def pack(events: list[Event]) -> tuple[EventEncoder, list[bytes]]:
    encoder, packer, pages = EventEncoder(), SubBufferPacker(), []
    for event in events:
        pages += packer.add(event.timestamp_ns, encoder.encode(event))
    pages.append(packer.flush())
    return encoder, [p for p in pages if p]


def entry(ts: int, n: int, s: str | None, names: tuple[str | None, str | None]) -> Event:
    return Event(
        ts,
        1,
        10,
        11,
        "w",
        ENTRY,
        ip=0x401000,
        args=(n, 200, 0xDEADBEEF, "\udc80", s, (-1, 0, 32767), names, 9),
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1 << 40),
            st.integers(-(1 << 63), (1 << 63) - 1),
            st.one_of(st.none(), st.text(alphabet=st.characters(codec="utf-8"), max_size=300)),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_events_round_trip(items: list[tuple[int, int, str | None]]) -> None:
    events, ts = [], 1000
    for gap, n, s in items:
        ts += gap
        events.append(entry(ts, n, s, (s, None)))
        events.append(
            Event(
                ts + 1,
                1,
                10,
                11,
                "w",
                RETURN,
                ip=0x401000,
                ret_ip=0x402000,
                args=(n & (2**64 - 1),),
            )
        )
    encoder, pages = pack(events)
    assert decode(encoder, pages) == events


def test_long_gaps_sub_buffer_breaks_and_usdt() -> None:
    events = [entry(5 + i * (1 << 30), i, "x" * (i % 50), ("a", "")) for i in range(400)]
    events.append(Event(events[-1].timestamp_ns + 1, 1, 10, 11, "w", USDT, ip=0x1234, args=(-7,)))
    encoder, pages = pack(events)
    assert len(pages) > 5
    decoded = decode(encoder, pages)
    assert decoded == events
    assert decoded[-1].type.kind is ProbeKind.USDT


def test_losses_are_flagged_on_the_next_sub_buffer() -> None:
    encoder, packer = EventEncoder(), SubBufferPacker()
    pages = packer.add(100, encoder.encode(entry(100, 1, "a", ("a", "b"))))
    pages += packer.lose(17)
    pages += packer.add(200, encoder.encode(entry(200, 2, "b", ("a", "b"))))
    pages += packer.lose(-1)
    pages.append(packer.flush())
    decoder = EventDecoder(SubBufferLayout(), strict=True)
    for system, text in encoder.formats:
        event_format = parse_event_format(text, system=system)
        decoder.add_event(
            event_format, event_type=encoder.event_types[event_format.id], kind=ProbeKind.UPROBE
        )
    batches = [decoder.decode(page, 0) for page in pages]
    assert [(len(b.events), b.lost) for b in batches] == [(1, 0), (1, 17), (0, -1)]


def test_the_synthesized_format_is_the_kernels_uprobe_layout() -> None:
    text = probe_format_text(ENTRY, 61440)
    event_format = parse_event_format(text, system="uprobes")
    fields = [(f.name, f.type, f.offset, f.size, f.signed) for f in event_format.fields]
    assert fields == [
        ("__probe_ip", "unsigned long", 8, 8, False),
        ("n", "s64", 16, 8, True),
        ("u", "u8", 24, 1, False),
        ("x", "u32", 25, 4, False),
        ("c", "u8", 29, 1, False),
        ("s", "__data_loc char[]", 30, 4, True),
        ("arr", "s16", 34, 6, True),
        ("names", "__data_loc char[][2]", 40, 8, True),
        ("b", "u32", 48, 4, False),
    ]
    assert event_format.print_fmt.startswith('"(%lx) n=%Ld u=%u x=0x%x c=\'%c\' s=\\"%s\\"')
    assert parse_event_format(format_text(event_format), system="uprobes") == event_format
