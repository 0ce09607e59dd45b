"""Records to Events: argument types, task names, dispatch, errors — on synthetic records."""

from __future__ import annotations

import struct

import pytest

from probescope.errors import RingBufferFormatError
from probescope.events import EventType
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.traceevent import decoder as decoder_module
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.event_layout import infer_probe_arg_types
from probescope.traceevent.format import EventFormat, parse_event_format
from probescope.traceevent.ringbuffer import SubBufferLayout
from unit.tracefs import synthetic as s

LE = SubBufferLayout(byteorder="little")
BE = SubBufferLayout(byteorder="big")
COMMON = (
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
)


def event_format(
    name: str, event_id: int, fields: list[tuple[str, int, int, int]], fmt: str = '""'
) -> str:
    """A format file: `fields` are (declaration, offset, size, signed)."""
    lines = "".join(
        f"\tfield:{decl};\toffset:{offset};\tsize:{size};\tsigned:{signed};\n"
        for decl, offset, size, signed in fields
    )
    return f"name: {name}\nID: {event_id}\nformat:\n{COMMON}{lines}\nprint fmt: {fmt}\n"


# A uprobe with one argument of each kind the decoder handles, as the kernel lays it out.
TYPES_DEFINITION = (
    "p:grp/types /bin/true:0x10 num=%di:s64 small=%si:s32 hex=%si:x32 letter=%cx:char "
    "text=+0(%dx):string bits=+0(%r8):b5@3/32 arr=+0(%r9):u8[3] harr=+0(%r9):x16[2] "
    "names=+0(%di):string[2] chars=+0(%dx):char[2]"
)
TYPES_FORMAT = event_format(
    "types",
    100,
    [
        ("unsigned long __probe_ip", 8, 8, 0),
        ("s64 num", 16, 8, 1),
        ("s32 small", 24, 4, 1),
        ("u32 hex", 28, 4, 0),
        ("u8 letter", 32, 1, 0),
        ("__data_loc char[] text", 33, 4, 1),
        ("u32 bits", 37, 4, 0),
        ("u8 arr[]", 41, 3, 0),
        ("u16 harr[]", 44, 4, 0),
        ("__data_loc char[] names[]", 48, 8, 1),
        ("u8 chars[]", 56, 2, 0),
    ],
    '"(%lx) num=%Ld small=%d hex=0x%x letter=\'%c\' text=\\"%s\\" bits=%u arr={%u,%u,%u} '
    'harr={0x%x,0x%x} names={\\"%s\\",\\"%s\\"} chars={\'%c\',\'%c\'}", REC->__probe_ip',
)


def types_record(order: str = "<", *, text: bytes | None = b"hi\xff") -> bytes:
    """The payload of one `types` hit; strings follow the 58 fixed bytes."""
    fixed = 58
    strings = b""

    def location(value: bytes | None) -> int:
        nonlocal strings
        if value is None:
            return fixed + len(strings)  # len 0: the read faulted
        at = fixed + len(strings)
        strings += value + b"\0"
        return (len(value) + 1) << 16 | at

    text_loc = location(text)
    name_locs = [location(b"alpha"), location(None)]
    args = struct.pack(
        order + "qiIBIIBBBHHIIBB",
        -5,  # num
        -100000,  # small
        0xFFFE7960,  # hex
        0xC8,  # letter: not ASCII
        text_loc,  # text: __data_loc
        17,  # bits: the kernel stores the extracted bitfield
        1,
        2,
        250,  # arr
        0x10,
        0xBEEF,  # harr
        *name_locs,  # names: two __data_loc words
        ord("o"),
        ord("k"),  # chars
    )
    payload = s.uprobe_entry(100, 4242, 0x5555_0000_1139, args, flags=1, preempt=2, order=order)
    assert len(payload) == fixed
    return payload + strings


def spec(line: str) -> ProbeSpec:
    parsed = parse_kernel_probe(line, events_file="uprobe_events")
    assert isinstance(parsed, ProbeSpec)
    return parsed


def decoder_for(fmt_text: str, definition: str | None = None, **options: object) -> EventDecoder:
    decoder = EventDecoder(LE, **options)  # type: ignore[arg-type]
    decoder.add_event(
        parse_event_format(fmt_text, system="grp"), probe=spec(definition) if definition else None
    )
    return decoder


def test_every_argument_type_decodes_as_its_probe_type() -> None:
    decoder = decoder_for(TYPES_FORMAT, TYPES_DEFINITION, comms={4242: "target"})
    batch = decoder.decode(s.sub_buffer(s.data(types_record(), delta=3), 1000), cpu=1)
    (event,) = batch.events
    assert (event.timestamp_ns, event.cpu, event.pid, event.tid, event.comm) == (
        1003,
        1,
        4242,
        4242,
        "target",
    )
    assert (event.ip, event.ret_ip, event.flags, event.preempt_count) == (
        0x5555_0000_1139,
        None,
        1,
        2,
    )
    assert event.kind is ProbeKind.UPROBE and event.group == "grp" and event.name == "types"
    assert event.arg_dict() == {
        "num": -5,
        "small": -100000,
        "hex": 0xFFFE7960,
        "letter": "\udcc8",
        "text": "hi\udcff",
        "bits": 17,
        "arr": (1, 2, 250),
        "harr": (0x10, 0xBEEF),
        "names": ("alpha", None),
        "chars": ("o", "k"),
    }
    assert event.arg("text").encode("utf-8", "surrogateescape") == b"hi\xff"


def test_types_inferred_from_print_fmt_match_the_spec() -> None:
    inferred = dict(infer_probe_arg_types(parse_event_format(TYPES_FORMAT)))
    assert {name: t.base for name, t in inferred.items()} == {
        "num": "s64",
        "small": "s32",
        "hex": "x32",
        "letter": "char",
        "text": "string",
        "bits": "u32",
        "arr": "u8",
        "harr": "x16",
        "names": "string",
        "chars": "char",
    }
    assert (inferred["arr"].count, inferred["harr"].count, inferred["names"].count) == (3, 2, 2)
    with_spec = decoder_for(TYPES_FORMAT, TYPES_DEFINITION)
    without = decoder_for(TYPES_FORMAT)
    page = s.sub_buffer(s.data(types_record()), 0)
    assert with_spec.decode(page, 0).events[0].args == without.decode(page, 0).events[0].args


def test_faulted_string_is_none_and_empty_string_is_empty() -> None:
    decoder = decoder_for(TYPES_FORMAT, TYPES_DEFINITION)
    page = s.sub_buffer(s.data(types_record(text=None)) + s.data(types_record(text=b"")), 0)
    assert [e.arg("text") for e in decoder.decode(page, 0).events] == [None, ""]


def test_return_probe_carries_function_and_return_address() -> None:
    fmt = event_format(
        "ret",
        101,
        [
            ("unsigned long __probe_func", 8, 8, 0),
            ("unsigned long __probe_ret_ip", 16, 8, 0),
            ("s32 rv", 24, 4, 1),
        ],
        '"(%lx <- %lx) rv=%d", REC->__probe_func, REC->__probe_ret_ip, REC->rv',
    )
    decoder = decoder_for(fmt)
    payload = s.uretprobe_entry(101, 7, 0x1000, 0x2000, struct.pack("<i", -1))
    (event,) = decoder.decode(s.sub_buffer(s.data(payload), 5), 0).events
    assert (event.kind, event.ip, event.ret_ip) == (ProbeKind.URETPROBE, 0x1000, 0x2000)
    assert event.args == (-1,)


def test_task_names_and_tgids() -> None:
    fmt = event_format("e", 102, [("unsigned long __probe_ip", 8, 8, 0)])
    decoder = decoder_for(fmt, comms={10: "main", 11: "worker"}, tgids={11: 10})
    records = b"".join(s.data(s.uprobe_entry(102, tid, 0)) for tid in (10, 11, 12, 0, 11))
    page = s.sub_buffer(records, 0)
    events = decoder.decode(page, 0).events
    assert [(e.tid, e.pid, e.comm) for e in events] == [
        (10, 10, "main"),
        (11, 10, "worker"),
        (12, 12, "<...>"),
        (0, 0, "<idle>"),
        (11, 10, "worker"),
    ]
    decoder.update_comms({12: "late"})
    decoder.update_tgids({12: 10})
    assert (decoder.decode(page, 0).events[2].comm, decoder.decode(page, 0).events[2].pid) == (
        "late",
        10,
    )


def test_unknown_event_raises_when_strict_and_is_counted_otherwise() -> None:
    fmt = event_format("e", 102, [("unsigned long __probe_ip", 8, 8, 0)])
    page = s.sub_buffer(s.data(s.uprobe_entry(999, 1, 0)) + s.data(s.uprobe_entry(102, 1, 0)), 0)
    with pytest.raises(RingBufferFormatError, match="event id 999") as raised:
        decoder_for(fmt).decode(page, 0)
    assert raised.value.hint is not None and "strict=False" in raised.value.hint
    lenient = decoder_for(fmt, strict=False)
    assert len(lenient.decode(page, 0)) == 1
    assert lenient.skipped == {999: 1}


def test_short_record_and_bad_string_location_raise() -> None:
    decoder = decoder_for(TYPES_FORMAT, TYPES_DEFINITION)
    short = s.sub_buffer(s.data(types_record()[:40]), 0)
    with pytest.raises(RingBufferFormatError, match="has 40 bytes, its format needs 58"):
        decoder.decode(short, 0)
    record = bytearray(types_record())
    struct.pack_into("<I", record, 33, 200 << 16 | 58)  # 200 bytes of text: past the record
    with pytest.raises(RingBufferFormatError, match="field 'text' points at 200 bytes"):
        decoder.decode(s.sub_buffer(s.data(bytes(record)), 0), 0)


def test_spec_that_does_not_match_the_format_is_refused() -> None:
    wrong = TYPES_DEFINITION.replace("small=%si:s32", "small=%si:s64")
    with pytest.raises(RingBufferFormatError, match="field 'small' is 's32' of 4 bytes") as raised:
        decoder_for(TYPES_FORMAT, wrong)
    assert raised.value.hint is not None and "redefined" in raised.value.hint
    missing = TYPES_DEFINITION + " extra=%ax"
    with pytest.raises(RingBufferFormatError, match="has no field 'extra'"):
        decoder_for(TYPES_FORMAT, missing)


def test_kind_must_match_the_layout_and_ids_must_be_unique() -> None:
    decoder = EventDecoder(LE)
    entry = parse_event_format(TYPES_FORMAT, system="grp")
    with pytest.raises(RingBufferFormatError, match="has no __probe_func/__probe_ret_ip"):
        decoder.add_event(entry, kind=ProbeKind.URETPROBE)
    decoder.add_event(entry)
    other = parse_event_format(
        event_format("other", 100, [("unsigned long __probe_ip", 8, 8, 0)]), system="grp"
    )
    with pytest.raises(RingBufferFormatError, match="already 'grp/types'"):
        decoder.add_event(other)
    with pytest.raises(RingBufferFormatError, match="its group is unknown"):
        EventDecoder(LE).add_event(parse_event_format(TYPES_FORMAT))


def test_many_events_are_dispatched_through_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    formats = [
        event_format(f"e{n}", 200 + n, [("unsigned long __probe_ip", 8, 8, 0), ("u32 v", 16, 4, 0)])
        for n in range(decoder_module.INLINE_EVENT_LIMIT + 2)
    ]
    records = b"".join(
        s.data(s.uprobe_entry(200 + n % len(formats), 5, n, struct.pack("<I", n)), delta=1)
        for n in range(20)
    )
    page = s.sub_buffer(records, 0, flags=s.MISSED_EVENTS | s.MISSED_STORED, lost=4)
    decoded = []
    for limit in (0, 100):
        monkeypatch.setattr(decoder_module, "INLINE_EVENT_LIMIT", limit)
        decoder = EventDecoder(LE, comms={5: "five"})
        for text in formats:
            decoder.add_event(parse_event_format(text, system="grp"))
        batch = decoder.decode(page, 2)
        assert batch.lost == 4 and batch.cpu == 2
        decoded.append([(e.timestamp_ns, e.name, e.ip, e.args, e.comm) for e in batch.events])
    assert decoded[0] == decoded[1]
    assert decoded[0][3] == (4, "e3", 3, (3,), "five")


def test_big_endian_records() -> None:
    decoder = EventDecoder(BE)
    decoder.add_event(parse_event_format(TYPES_FORMAT, system="grp"), probe=spec(TYPES_DEFINITION))
    little = decoder_for(TYPES_FORMAT, TYPES_DEFINITION)
    be_page = s.sub_buffer(s.data(types_record(">"), delta=9, order=">"), 1, order=">")
    le_page = s.sub_buffer(s.data(types_record("<"), delta=9), 1)
    (big,) = decoder.decode(be_page, 0).events
    (small,) = little.decode(le_page, 0).events
    assert big._replace(type=None) == small._replace(type=None)
    assert big.timestamp_ns == 10 and big.arg("names") == ("alpha", None)


def test_tracepoint_fields() -> None:
    fmt = event_format(
        "sched_process_fork",
        312,
        [
            ("char parent_comm[16]", 8, 16, 0),
            ("pid_t parent_pid", 24, 4, 1),
            ("__rel_loc char[] child_comm", 28, 4, 0),
            ("__data_loc unsigned long[] stack", 32, 4, 0),
            ("unsigned int counts[2]", 36, 8, 0),
            ("char odd[3]", 44, 3, 0),
        ],
    )
    decoder = EventDecoder(LE)
    event_type = decoder.add_event(parse_event_format(fmt, system="sched"))
    assert event_type.kind is ProbeKind.TRACEPOINT and event_type.system == "sched"
    payload = struct.pack(
        "<HBBi16siIIII3s",
        312,
        0,
        0,
        9,
        b"bash\0garbage\0\0\0",
        9,
        (6 << 16) | 20,  # __rel_loc: 6 bytes at 20 past the field's end (32), offset 52
        (16 << 16) | 58,  # __data_loc: 16 bytes at record offset 58
        7,
        8,
        b"abc",
    )
    payload += bytes(5) + b"child\0" + struct.pack("<QQ", 1, 2)
    (event,) = decoder.decode(s.sub_buffer(s.data(payload), 0), 0).events
    assert event.arg_dict() == {
        "parent_comm": "bash",
        "parent_pid": 9,
        "child_comm": "child",
        "stack": struct.pack("<QQ", 1, 2),
        "counts": (7, 8),
        "odd": "abc",
    }
    assert (event.ip, event.ret_ip) == (0, None)


def test_layout_of_common_type_is_checked() -> None:
    moved = TYPES_FORMAT.replace(
        "common_type;\toffset:0;\tsize:2",
        "common_type;\toffset:0;\tsize:4",
    )
    with pytest.raises(RingBufferFormatError, match="common_type is at offset 0 with size 4"):
        decoder_for(moved)


def test_event_types_are_reported_by_id() -> None:
    decoder = decoder_for(TYPES_FORMAT, TYPES_DEFINITION)
    (event_type,) = decoder.event_types.values()
    assert list(decoder.event_types) == [100]
    assert event_type.arg_names[:3] == ("num", "small", "hex")
    assert isinstance(parse_event_format(TYPES_FORMAT), EventFormat)


def test_the_event_type_of_a_probe_spec() -> None:
    probe = spec(TYPES_DEFINITION)
    made = EventType.of_probe(probe)
    assert (made.group, made.name, made.kind) == ("grp", "types", ProbeKind.UPROBE)
    assert made.arg_names == tuple(arg.name for arg in probe.args)
    assert made.arg_types == tuple(arg.type for arg in probe.args)
    assert made.format is None and made.system is None
    renamed = EventType.of_probe(probe, ProbeKind.USDT, group="session", name="types_1")
    assert (renamed.group, renamed.name, renamed.kind) == ("session", "types_1", ProbeKind.USDT)
    (decoded,) = decoder_for(TYPES_FORMAT, TYPES_DEFINITION).event_types.values()
    assert (decoded.arg_names, decoded.arg_types) == (made.arg_names, made.arg_types)
    assert decoded.format is not None and decoded.fields[0] == "__probe_ip"
