"""Sub-buffers of the kernel's ring buffer, as `per_cpu/cpuN/trace_pipe_raw` hands them out.

A sub-buffer is a header (`u64 timestamp`, `local_t commit` whose bits 31/30 flag missed
events and a stored lost count) followed by 4-byte aligned records. Each record starts with a
u32 `type_len:5 time_delta:27` (bit order follows the kernel's endianness): `1..28` data of
`4*type_len` bytes, `0` data whose length is in the next u32, `29` padding (delta 0: nothing
more on this page; else a discarded event to skip), `30` a time extension, `31` an absolute
time stamp whose top five bits come from the running clock. Layout values come from
`header_page`/`header_event` (see `format.py`); this module reads bytes and touches no file.

Speed: the walk over records is compiled once per layout into a Python function, with the
per-record work spliced in as source (`compile_reader`). That removes a function call and a
dictionary lookup per record, which is most of the difference between ~1.3 and ~1.5 million
decoded events per second on this project's reference machine. `iter_records` uses the same
compiled walk, so the generic and the fast path cannot disagree.
"""

from __future__ import annotations

import linecache
import sys
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import count
from typing import Any, Literal, NamedTuple

from probescope.errors import RingBufferFormatError
from probescope.traceevent.format import HeaderEvent, HeaderPage

RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
COMMIT_MASK = (1 << 27) - 1
TS_MSB = 0xF8 << 56
LOST_UNKNOWN = -1
"""`SubBufferHeader.lost` when the kernel flagged missed events without storing their count."""

_WORD_TYPECODE = next(code for code in "IL" if array(code).itemsize == 4)


@dataclass(frozen=True)
class SubBufferLayout:
    """Where a sub-buffer keeps its parts, and the byte order of its words.

    Defaults are a 64-bit kernel with 4 KiB sub-buffers; build real layouts with
    `from_header_page` so a kernel with another `buffer_subbuf_size_kb` or word size works.
    """

    data_offset: int = 16
    data_size: int = 4080
    timestamp_offset: int = 0
    commit_offset: int = 8
    long_size: int = 8
    byteorder: Literal["little", "big"] = sys.byteorder
    header_event: HeaderEvent = field(default_factory=HeaderEvent)

    @classmethod
    def from_header_page(
        cls,
        header_page: HeaderPage,
        *,
        header_event: HeaderEvent | None = None,
        sub_buffer_size: int | None = None,
        byteorder: Literal["little", "big"] = sys.byteorder,
    ) -> SubBufferLayout:
        """The layout `header_page` describes; `sub_buffer_size` (bytes, from
        `buffer_subbuf_size_kb`) overrides the data size when the two disagree."""
        if byteorder not in ("little", "big"):
            raise RingBufferFormatError(f"byte order must be 'little' or 'big', not {byteorder!r}")
        data_size = header_page.data_size
        if sub_buffer_size is not None:
            if sub_buffer_size <= header_page.data_offset or sub_buffer_size % 4:
                raise RingBufferFormatError(
                    f"sub-buffer size {sub_buffer_size} cannot hold the "
                    f"{header_page.data_offset}-byte sub-buffer header"
                )
            data_size = sub_buffer_size - header_page.data_offset
        return cls(
            data_offset=header_page.data_offset,
            data_size=data_size,
            timestamp_offset=header_page.timestamp.offset,
            commit_offset=header_page.commit.offset,
            long_size=header_page.long_size,
            byteorder=byteorder,
            header_event=header_event or HeaderEvent(),
        )

    @property
    def size(self) -> int:
        """Bytes of one sub-buffer: what one `read(2)` of `trace_pipe_raw` returns."""
        return self.data_offset + self.data_size

    @property
    def struct_prefix(self) -> str:
        """The `struct` byte-order character for fields of this layout's records."""
        return "<" if self.byteorder == "little" else ">"


class SubBufferHeader(NamedTuple):
    """`timestamp` of the first record's clock base, `size` bytes of records after the header,
    `lost` events the kernel dropped before this sub-buffer (0, a count, or LOST_UNKNOWN)."""

    timestamp: int
    size: int
    lost: int


class Record(NamedTuple):
    """A data record: its time, and where its payload (the event entry) sits in the
    sub-buffer. `length` may include up to 3 bytes of alignment padding."""

    timestamp: int
    offset: int
    length: int


SubBufferReader = Callable[[bytes, int], tuple[list[Any], int]]
"""`reader(sub_buffer, cpu) -> (items, lost)`, made by `compile_reader`."""


def read_header(layout: SubBufferLayout, sub_buffer: bytes) -> SubBufferHeader:
    """Decode and bounds-check a sub-buffer's header."""
    length = len(sub_buffer)
    if length < layout.data_offset:
        raise RingBufferFormatError(
            f"sub-buffer of {length} bytes is shorter than its {layout.data_offset}-byte header",
            hint="read trace_pipe_raw with a buffer of at least one whole sub-buffer",
        )
    if length % 4:
        raise RingBufferFormatError(f"sub-buffer of {length} bytes is not a multiple of 4 bytes")
    order = layout.byteorder
    start = layout.timestamp_offset
    timestamp = int.from_bytes(sub_buffer[start : start + 8], order)
    start = layout.commit_offset
    commit = int.from_bytes(sub_buffer[start : start + layout.long_size], order)
    size = commit & COMMIT_MASK
    room = min(length, layout.size) - layout.data_offset
    if size > room:
        raise RingBufferFormatError(
            f"sub-buffer commit says {size} bytes of records but only {room} follow the header",
            hint="the data may not be a trace_pipe_raw sub-buffer of this layout",
        )
    lost = 0
    if commit & RB_MISSED_EVENTS:
        if commit & RB_MISSED_STORED:
            start = layout.data_offset + size
            if start + layout.long_size > length:
                raise RingBufferFormatError(
                    f"sub-buffer flags a stored lost count at offset {start}, past its end"
                )
            lost = int.from_bytes(sub_buffer[start : start + layout.long_size], order)
        else:
            lost = LOST_UNKNOWN
    return SubBufferHeader(timestamp, size, lost)


def iter_records(layout: SubBufferLayout, sub_buffer: bytes) -> Iterator[Record]:
    """Every data record of a sub-buffer, with its absolute timestamp."""
    records, _ = _record_reader(layout)(bytes(sub_buffer), -1)
    return iter(records)


def split_sub_buffers(layout: SubBufferLayout, data: bytes) -> Iterator[bytes]:
    """Cut data saved from `trace_pipe_raw` (whole sub-buffers back to back) into sub-buffers."""
    size = layout.size
    if len(data) % size:
        raise RingBufferFormatError(
            f"{len(data)} bytes of raw data is not a whole number of {size}-byte sub-buffers",
            hint="check buffer_subbuf_size_kb of the instance the data came from",
        )
    view = memoryview(data)
    for start in range(0, len(data), size):
        yield bytes(view[start : start + size])


def compile_reader(
    layout: SubBufferLayout,
    *,
    record_body: str,
    setup: str = "",
    namespace: Mapping[str, object] | None = None,
    name: str = "read_sub_buffer",
) -> SubBufferReader:
    """Compile a sub-buffer walk that runs `record_body` for every data record.

    The body is Python source (indented 8 spaces in the result, write it unindented) that sees
    `sub_buffer` (bytes), `cpu`, `words` (the sub-buffer as host-order u32 values of the
    kernel's byte order), `start` (payload offset), `pos` (offset of the next record, so the
    payload is `sub_buffer[start:pos]`), `ts` (the record's timestamp) and `append` (adds an
    item to the result). `setup` runs once before the walk, `namespace` supplies the globals the
    body uses. The function returns `(items, lost)`.
    """
    source = _reader_source(layout, record_body, setup, name)
    filename = f"<probescope sub-buffer reader {next(_reader_numbers)}: {name}>"
    globals_: dict[str, object] = {
        "_read_header": _header_reader(layout),
        "_words": _words_reader(layout),
        "_truncated": _truncated,
        "_overrun": _overrun,
        "_bad_type": _bad_type,
        "_bad_length": _bad_length,
        "_absolute": _absolute_timestamp,
    }
    globals_.update(namespace or {})
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, globals_)
    reader: SubBufferReader = globals_[name]  # type: ignore[assignment]
    return reader


_reader_numbers = count(1)

_TEMPLATE = """\
def {name}(sub_buffer, cpu):
    ts, size, lost = _read_header(sub_buffer)
    words = _words(sub_buffer)
    out = []
    append = out.append
    pos = {data_offset}
    end = {data_offset} + size
{setup}
    while pos < end:
        word = words[pos >> 2]
        type_len = {type_len}
        if 0 < type_len <= {data_max}:
            ts += {delta}
            start = pos + 4
            pos = start + (type_len << 2)
        elif type_len == 0:
            if pos + 8 > end:
                _truncated(pos, end)
            length = words[(pos >> 2) + 1]
            if length < 4:
                _bad_length(pos, length)
            ts += {delta}
            start = pos + 8
            pos = start + ((length - 1) & -4)
        elif type_len == {padding}:
            delta = {delta}
            if not delta:
                break
            if pos + 8 > end:
                _truncated(pos, end)
            ts += delta
            start = pos
            pos += 4 + words[(pos >> 2) + 1]
            if pos > end:
                _overrun(start, pos, end)
            continue
        elif type_len == {time_extend}:
            if pos + 8 > end:
                _truncated(pos, end)
            ts += (words[(pos >> 2) + 1] << {delta_bits}) | {delta}
            pos += 8
            continue
        elif type_len == {time_stamp}:
            if pos + 8 > end:
                _truncated(pos, end)
            ts = _absolute((words[(pos >> 2) + 1] << {delta_bits}) | {delta}, ts)
            pos += 8
            continue
        else:
            _bad_type(pos, type_len)
        if pos > end:
            _overrun(start, pos, end)
{body}
    return out, lost
"""


def _reader_source(layout: SubBufferLayout, body: str, setup: str, name: str) -> str:
    header = layout.header_event
    type_len_mask = (1 << header.type_len_bits) - 1
    delta_mask = (1 << header.time_delta_bits) - 1
    if layout.byteorder == "little":
        type_len = f"word & {type_len_mask}"
        delta = f"(word >> {header.type_len_bits})"
    else:
        type_len = f"word >> {header.time_delta_bits}"
        delta = f"(word & {delta_mask})"
    return _TEMPLATE.format(
        name=name,
        data_offset=layout.data_offset,
        data_max=header.data_max_type_len,
        padding=header.padding,
        time_extend=header.time_extend,
        time_stamp=header.time_stamp,
        delta_bits=header.time_delta_bits,
        type_len=type_len,
        delta=delta,
        setup=_indent(setup, 4) if setup.strip() else "",
        body=_indent(body, 8),
    )


def _indent(source: str, spaces: int) -> str:
    pad = " " * spaces
    lines = [pad + line if line.strip() else "" for line in source.strip("\n").splitlines()]
    return "\n".join(lines)


def _header_reader(layout: SubBufferLayout) -> Callable[[bytes], SubBufferHeader]:
    def read(sub_buffer: bytes) -> SubBufferHeader:
        return read_header(layout, sub_buffer)

    return read


def _words_reader(layout: SubBufferLayout) -> Callable[[bytes], array[int]]:
    swap = layout.byteorder != sys.byteorder

    def words(sub_buffer: bytes) -> array[int]:
        values = array(_WORD_TYPECODE)
        values.frombytes(sub_buffer)
        if swap:
            values.byteswap()
        return values

    return words


def _absolute_timestamp(stamp: int, current: int) -> int:
    """A TIME_STAMP record's 59-bit time with the top bits restored from the running clock
    (the kernel's `rb_fix_abs_ts`)."""
    if current & TS_MSB:
        stamp |= current & TS_MSB
        if stamp < current:
            stamp += 1 << 59
    return stamp


def _truncated(pos: int, end: int) -> None:
    raise RingBufferFormatError(
        f"sub-buffer record at offset {pos} needs 8 bytes but the records end at {end}"
    )


def _overrun(start: int, pos: int, end: int) -> None:
    raise RingBufferFormatError(
        f"sub-buffer record with payload at offset {start} runs to {pos}, past the end of the "
        f"records at {end}"
    )


def _bad_type(pos: int, type_len: int) -> None:
    raise RingBufferFormatError(
        f"sub-buffer record at offset {pos} has unknown type_len {type_len}"
    )


def _bad_length(pos: int, length: int) -> None:
    raise RingBufferFormatError(
        f"sub-buffer record at offset {pos} has a length word of {length}, less than 4"
    )


@lru_cache(maxsize=16)
def _record_reader(layout: SubBufferLayout) -> SubBufferReader:
    return compile_reader(
        layout,
        record_body="append(_Record(ts, start, pos - start))",
        namespace={"_Record": Record},
        name="read_records",
    )
