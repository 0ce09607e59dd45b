"""Parsing tracefs's format, header_page, header_event, saved_cmdlines and saved_tgids files."""

from __future__ import annotations

import pytest

from probescope.errors import RingBufferFormatError
from probescope.traceevent.format import (
    HeaderEvent,
    parse_event_format,
    parse_header_event,
    parse_header_page,
    parse_print_fmt,
    parse_saved_cmdlines,
    parse_saved_tgids,
)

# events/<group>/types/format of a uprobe on Linux 6.18 (abridged), fields as the kernel prints
UPROBE_FORMAT = """\
name: types
ID: 2326
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;
\tfield:s64 number;\toffset:16;\tsize:8;\tsigned:1;
\tfield:__data_loc char[] text;\toffset:24;\tsize:4;\tsigned:1;
\tfield:u8 bytes[];\toffset:28;\tsize:4;\tsigned:0;

print fmt: "(%lx) number=%Ld text=\\"%s\\" bytes={%u,%u,%u,%u}", REC->__probe_ip, REC->number, \
__get_str(text), REC->bytes[0], REC->bytes[1], REC->bytes[2], REC->bytes[3]
"""

# events/sched/sched_process_fork/format on Linux 6.18
TRACEPOINT_FORMAT = """\
name: sched_process_fork
ID: 312
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:__rel_loc char[] child_comm;\toffset:28;\tsize:4;\tsigned:0;

print fmt: "comm=%s pid=%d child_comm=%s", REC->parent_comm, REC->parent_pid, \
__get_rel_str(child_comm)
"""

HEADER_PAGE = """\
\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;
"""

HEADER_EVENT = """\
# compressed entry header
\ttype_len    :    5 bits
\ttime_delta  :   27 bits
\tarray       :   32 bits

\tpadding     : type == 29
\ttime_extend : type == 30
\ttime_stamp : type == 31
\tdata max type_len  == 28
"""


def test_uprobe_format() -> None:
    event = parse_event_format(UPROBE_FORMAT, system="grp")
    assert (event.name, event.id, event.system, event.label) == ("types", 2326, "grp", "grp/types")
    assert [f.name for f in event.common_fields] == [
        "common_type",
        "common_flags",
        "common_preempt_count",
        "common_pid",
    ]
    assert [f.name for f in event.fields] == ["__probe_ip", "number", "text", "bytes"]
    pid = event.field("common_pid")
    assert (pid.type, pid.offset, pid.size, pid.signed) == ("int", 4, 4, True)
    text = event.field("text")
    assert (text.type, text.is_data_loc, text.is_dynamic, text.element_type) == (
        "__data_loc char[]",
        True,
        True,
        "char",
    )
    array = event.field("bytes")
    assert (array.type, array.is_array, array.array_length, array.size) == ("u8", True, None, 4)
    assert event.fixed_size == 32
    assert event.print_fmt.startswith('"(%lx) number=%Ld')


def test_tracepoint_format_with_fixed_array_and_rel_loc() -> None:
    event = parse_event_format(TRACEPOINT_FORMAT, system="sched")
    comm = event.field("parent_comm")
    assert (comm.type, comm.is_array, comm.array_length, comm.element_type) == (
        "char",
        True,
        16,
        "char",
    )
    child = event.field("child_comm")
    assert (child.is_rel_loc, child.is_data_loc, child.end) == (True, False, 32)


def test_unknown_field_lists_the_known_ones() -> None:
    event = parse_event_format(UPROBE_FORMAT)
    with pytest.raises(RingBufferFormatError, match="has no field 'nope'") as raised:
        event.field("nope")
    assert raised.value.hint is not None and "__probe_ip" in raised.value.hint


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nID: 1\n\tfield:int a;\toffset:0;\n", r"line 3: expected 'field:TYPE NAME;"),
        ("name: x\nID: one\n", "ID is not a number"),
        ("name: x\nformat:\n", "has no ID: line"),
        ("ID: 3\n", "has no name: line"),
        ("name: x\nID: 1\nsomething else\n", "line 3: unexpected line 'something else'"),
        ("name: x\nID: 1\n\tfield:;\toffset:0;\tsize:1;\tsigned:0;\n", "cannot find type and name"),
    ],
)
def test_malformed_format_files(text: str, message: str) -> None:
    with pytest.raises(RingBufferFormatError, match=message):
        parse_event_format(text)


def test_header_page() -> None:
    header = parse_header_page(HEADER_PAGE)
    assert (header.data_offset, header.data_size, header.long_size) == (16, 4080, 8)
    assert header.sub_buffer_size == 4096
    assert header.overwrite is not None and header.overwrite.offset == 8


def test_header_page_of_a_32_bit_kernel() -> None:
    text = HEADER_PAGE.replace("size:8;\tsigned:1", "size:4;\tsigned:1").replace(
        "offset:16;\tsize:4080", "offset:12;\tsize:4084"
    )
    header = parse_header_page(text)
    assert (header.data_offset, header.long_size) == (12, 4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER_PAGE.replace("commit", "committed"), "no 'commit' field"),
        (HEADER_PAGE.replace("offset:0;\tsize:8", "offset:0;\tsize:4"), "timestamp is 4 bytes"),
        (HEADER_PAGE.replace("offset:16;", "offset:18;"), "not 4-byte aligned"),
        (HEADER_PAGE.replace("size:8;\tsigned:1", "size:2;\tsigned:1"), "commit is 2 bytes"),
    ],
)
def test_bad_header_page(text: str, message: str) -> None:
    with pytest.raises(RingBufferFormatError, match=message):
        parse_header_page(text)


def test_header_event() -> None:
    assert parse_header_event(HEADER_EVENT) == HeaderEvent()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER_EVENT.replace("27 bits", "26 bits"), "expected a 32-bit word"),
        (HEADER_EVENT.replace("type == 31", "type == 30"), "must be distinct"),
        (HEADER_EVENT.replace("\tarray       :   32 bits\n", ""), "does not describe array_bits"),
    ],
)
def test_header_event_the_decoder_cannot_read(text: str, message: str) -> None:
    with pytest.raises(RingBufferFormatError, match=message):
        parse_header_event(text)


def test_print_fmt_unescapes_the_string_and_splits_arguments() -> None:
    fmt = parse_print_fmt(parse_event_format(UPROBE_FORMAT).print_fmt)
    assert fmt.format == '(%lx) number=%Ld text="%s" bytes={%u,%u,%u,%u}'
    assert fmt.args[:3] == ("REC->__probe_ip", "REC->number", "__get_str(text)")
    assert len(fmt.args) == 7
    nested = parse_print_fmt('"a=%s b=%d", f(x, "y,z"), g(1, (2, 3))')
    assert nested.args == ('f(x, "y,z")', "g(1, (2, 3))")
    assert parse_print_fmt('"tab\\there"').format == "tab\there"


@pytest.mark.parametrize(
    ("text", "message"),
    [("x=%d", "does not start with a string"), ('"open', "not closed"), ('"a" b', "expected ','")],
)
def test_bad_print_fmt(text: str, message: str) -> None:
    with pytest.raises(RingBufferFormatError, match=message):
        parse_print_fmt(text)


def test_saved_cmdlines_and_tgids() -> None:
    assert parse_saved_cmdlines("7059 t\n15 rcu_preempt\n41 kworker/1:1\n") == {
        7059: "t",
        15: "rcu_preempt",
        41: "kworker/1:1",
    }
    assert parse_saved_cmdlines(b"12 with space\n13 \xff\n") == {12: "with space", 13: "\udcff"}
    assert parse_saved_tgids("100 100\n101 100\nbad line\n") == {100: 100, 101: 100}
