"""Sub-buffer walking: every record type, both byte orders, and the bounds checks."""

from __future__ import annotations

import struct

import pytest

from probescope.errors import RingBufferFormatError
from probescope.traceevent.format import HeaderEvent, parse_header_page
from probescope.traceevent.ringbuffer import (
    LOST_UNKNOWN,
    TS_MSB,
    Record,
    SubBufferLayout,
    compile_reader,
    iter_records,
    read_header,
    split_sub_buffers,
)
from unit.tracefs import synthetic as s

LE = SubBufferLayout(byteorder="little")
BE = SubBufferLayout(byteorder="big")


def records(layout: SubBufferLayout, page: bytes) -> list[tuple[int, bytes]]:
    """(timestamp, payload) of each data record."""
    return [(r.timestamp, page[r.offset : r.offset + r.length]) for r in iter_records(layout, page)]


def test_literal_sub_buffer_with_one_small_record() -> None:
    page = bytes.fromhex(
        "e803000000000000"  # timestamp 1000 (u64)
        "0c00000000000000"  # commit: 12 bytes of records, no flags (local_t, 8 bytes)
        "a2000000"  # record header: type_len 2 (8 bytes of data), time_delta 5 (5 << 5 | 2)
        "0102030405060708"  # payload
    ) + bytes(4096 - 28)
    assert read_header(LE, page) == (1000, 12, 0)
    assert list(iter_records(LE, page)) == [Record(1005, 20, 8)]


def test_data_records_of_every_small_length_accumulate_deltas() -> None:
    body = b"".join(s.data(bytes([n]) * (4 * n), delta=n) for n in range(1, 29))
    page = s.sub_buffer(body, 10_000)
    got = records(LE, page)
    assert [len(payload) for _, payload in got] == [4 * n for n in range(1, 29)]
    assert [ts for ts, _ in got] == [10_000 + n * (n + 1) // 2 for n in range(1, 29)]


def test_type_len_zero_record_takes_length_from_array_and_rounds_up() -> None:
    payload = bytes(range(130))  # 130 bytes: padded to 132 in the record
    body = s.data(payload, delta=7, long=True) + s.data(b"next", delta=1)
    got = records(LE, s.sub_buffer(body, 50))
    assert got[0] == (57, payload + bytes(2))
    assert got[1] == (58, b"next")


def test_time_extend_adds_its_59_bit_delta() -> None:
    extend = (3 << 27) | 12345  # needs array[0] = 3
    body = s.data(b"aaaa", delta=1) + s.time_extend(extend) + s.data(b"bbbb", delta=0)
    got = records(LE, s.sub_buffer(body, 1_000_000))
    assert [ts for ts, _ in got] == [1_000_001, 1_000_001 + extend]


def test_time_stamp_is_absolute_and_restores_the_top_bits_from_the_clock() -> None:
    page_time = (0b10101 << 59) | 5_000
    stamp = 7_000_000  # the record keeps only the low 59 bits
    body = s.data(b"aaaa", delta=2) + s.time_stamp(stamp) + s.data(b"bbbb", delta=3)
    got = records(LE, s.sub_buffer(body, page_time))
    assert got[0][0] == page_time + 2
    assert got[1][0] == (page_time & TS_MSB) | stamp + 3


def test_time_stamp_below_the_running_clock_wraps_into_the_next_59_bit_epoch() -> None:
    page_time = (1 << 59) | ((1 << 59) - 10)  # just before the low 59 bits wrap
    body = s.time_stamp(4) + s.data(b"aaaa")
    ((ts, _),) = records(LE, s.sub_buffer(body, page_time))
    assert ts == (1 << 59) + (1 << 59) + 4  # kernel rb_fix_abs_ts: += 1 << 59


def test_time_stamp_without_top_bits_is_taken_as_is() -> None:
    body = s.time_stamp(123) + s.data(b"aaaa", delta=1)
    assert records(LE, s.sub_buffer(body, 1 << 40)) == [(124, b"aaaa")]


def test_null_padding_ends_the_sub_buffer_even_inside_the_commit() -> None:
    body = s.data(b"aaaa", delta=1) + s.null_padding() + s.data(b"bbbb", delta=1)
    assert records(LE, s.sub_buffer(body, 0)) == [(1, b"aaaa")]


def test_discarded_event_is_skipped_but_its_delta_counts_like_libtraceevent() -> None:
    body = s.data(b"aaaa", delta=1) + s.discarded(20, delta=100) + s.data(b"bbbb", delta=10)
    assert records(LE, s.sub_buffer(body, 0)) == [(1, b"aaaa"), (111, b"bbbb")]


def test_missed_events_with_a_stored_count() -> None:
    body = s.data(b"aaaa")
    page = s.sub_buffer(body, 9, flags=s.MISSED_EVENTS | s.MISSED_STORED, lost=1234)
    assert read_header(LE, page) == (9, 8, 1234)
    assert records(LE, page) == [(9, b"aaaa")]


def test_missed_events_without_room_for_the_count_is_unknown() -> None:
    page = s.sub_buffer(s.data(b"aaaa"), 9, flags=s.MISSED_EVENTS)
    assert read_header(LE, page).lost == LOST_UNKNOWN


def test_commit_bits_above_the_size_mask_are_ignored() -> None:
    page = s.sub_buffer(s.data(b"aaaa"), 0, flags=1 << 29)
    assert read_header(LE, page).size == 8


def test_big_endian_sub_buffer() -> None:
    body = (
        s.data(b"AAAA", delta=3, order=">")
        + s.time_extend(1 << 28, order=">")
        + s.data(bytes(130), delta=1, order=">", long=True)
        + s.discarded(8, delta=5, order=">")
        + s.data(b"BBBB", delta=1, order=">")
    )
    page = s.sub_buffer(body, 77, order=">", flags=s.MISSED_EVENTS | s.MISSED_STORED, lost=3)
    assert read_header(BE, page) == (77, len(body), 3)
    got = records(BE, page)
    assert [ts for ts, _ in got] == [80, 80 + (1 << 28) + 1, 80 + (1 << 28) + 7]
    assert [p[:4] for _, p in got] == [b"AAAA", bytes(4), b"BBBB"]


def test_layout_follows_header_page_and_sub_buffer_size() -> None:
    header = parse_header_page(
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
        "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
        "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
        "\tfield: char data;\toffset:16;\tsize:8176;\tsigned:0;\n"
    )
    layout = SubBufferLayout.from_header_page(header)
    assert (layout.size, layout.data_offset, layout.long_size) == (8192, 16, 8)
    assert SubBufferLayout.from_header_page(header, sub_buffer_size=16384).data_size == 16368
    body = s.data(b"x" * 8, delta=1) * 500  # 6000 bytes: more than a 4 KiB page holds
    page = s.sub_buffer(body, 0, size=8192)
    assert len(records(layout, page)) == 500
    with pytest.raises(RingBufferFormatError, match="only 4080 follow"):
        read_header(LE, page[:4096])


def test_thirty_two_bit_commit_word() -> None:
    layout = SubBufferLayout(data_offset=12, data_size=4084, long_size=4)
    page = struct.pack("<QI", 5, 8) + s.data(b"abcd", delta=1)
    page += bytes(4096 - len(page))
    assert records(layout, page) == [(6, b"abcd")]


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (bytes(8), "shorter than its 16-byte header"),
        (bytes(4098), "not a multiple of 4"),
        (s.sub_buffer(b"", 0, commit=5000, size=4096), "5000 bytes of records"),
        (s.sub_buffer(s.data(b"aaaa"), 0, commit=4), "runs to 24, past the end of the records"),
        (s.sub_buffer(s.time_extend(1 << 30), 0, commit=4), "needs 8 bytes"),
        (s.sub_buffer(s.data(bytes(200), long=True), 0, commit=100), "past the end"),
        (s.sub_buffer(s.header_word(0, 0) + struct.pack("<I", 2), 0), "length word of 2"),
        (s.sub_buffer(s.discarded(64, 1), 0, commit=20), "past the end"),
        (
            s.sub_buffer(s.data(b"a"), 0, flags=s.MISSED_EVENTS | s.MISSED_STORED, commit=4080),
            "stored lost count at offset 4096, past its end",
        ),
    ],
)
def test_malformed_sub_buffers_raise(page: bytes, message: str) -> None:
    with pytest.raises(RingBufferFormatError, match=message):
        list(iter_records(LE, page))


def test_undefined_type_len_is_refused() -> None:
    layout = SubBufferLayout(header_event=HeaderEvent(data_max_type_len=27))
    page = s.sub_buffer(s.header_word(28, 1) + bytes(4), 0)
    with pytest.raises(RingBufferFormatError, match="unknown type_len 28"):
        list(iter_records(layout, page))


def test_split_sub_buffers() -> None:
    pages = [s.sub_buffer(s.data(bytes([n]) * 4), n) for n in range(3)]
    assert list(split_sub_buffers(LE, b"".join(pages))) == pages
    with pytest.raises(RingBufferFormatError, match="whole number of 4096-byte"):
        list(split_sub_buffers(LE, bytes(5000)))


def test_compiled_reader_runs_setup_and_body_per_data_record() -> None:
    reader = compile_reader(
        LE,
        setup="seen = 0",
        record_body="seen += 1\nappend((seen, cpu, ts, sub_buffer[start:pos]))",
        name="count_records",
    )
    page = s.sub_buffer(s.data(b"aaaa", 1) + s.time_extend(9) + s.data(b"bbbb", 1), 100, flags=0)
    items, lost = reader(page, 3)
    assert lost == 0
    assert items == [(1, 3, 101, b"aaaa"), (2, 3, 111, b"bbbb")]
