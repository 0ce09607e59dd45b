"""trace-cmd's trace.dat container, read: versions 6 and 7 (sections, zlib or zstd compression).

What a file holds (see trace-cmd's `trace-cmd.dat.v6`/`.v7` man pages): the magic and
`tracing` + version, byte order, long size and page size; `header_page` and `header_event`;
ftrace's own event formats; the other formats grouped by system; kallsyms; printk formats;
saved_cmdlines; a list of options (id, size, bytes); and per-CPU ring-buffer data — raw
sub-buffers exactly as `trace_pipe_raw` gave them, one contiguous run per CPU (version 7 may
compress each run in chunks). Version 6 lays these out in that order; version 7 puts each in a
section found through options. Nothing here decodes records: `TraceDat` hands out the texts,
the options and each CPU's sub-buffers.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from probescope.errors import RecordingError

MAGIC = b"\x17\x08\x44tracing"

OPTION_DONE = 0
OPTION_DATE = 1
OPTION_CPUSTAT = 2
OPTION_BUFFER = 3
OPTION_TRACECLOCK = 4
OPTION_UNAME = 5
OPTION_CPUCOUNT = 8
OPTION_VERSION = 9
OPTION_PROCMAPS = 10
OPTION_HEADER_INFO = 16
OPTION_FTRACE_EVENTS = 17
OPTION_EVENT_FORMATS = 18
OPTION_KALLSYMS = 19
OPTION_PRINTK = 20
OPTION_CMDLINES = 21
OPTION_BUFFER_TEXT = 22
OPTION_PROBESCOPE = 0x5053
"""probescope's own option ("PS"): what an offline report needs beyond trace-cmd's sections
(see `facts`). trace-cmd skips options it does not know."""

SECTION_COMPRESSED = 1
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class CpuData:
    """Where one CPU's sub-buffers are: `size` bytes at `offset` (compressed: the chunk list)."""

    cpu: int
    offset: int
    size: int


@dataclass(frozen=True)
class TraceBuffer:
    """The ring-buffer data of one tracefs instance ("" is the top one)."""

    name: str
    cpus: tuple[CpuData, ...]
    clock: str | None = None
    page_size: int = 4096
    compressed: bool = False


@dataclass
class TraceDat:
    """A parsed trace.dat: its self-descriptions as the kernel's files had them (bytes), its
    options, and its buffers. Read from a seekable binary `stream`; `from_path` opens a file.
    CPU data is read only when `sub_buffers` asks for it."""

    stream: IO[bytes]
    version: int = 6
    byteorder: Literal["little", "big"] = "little"
    long_size: int = 8
    page_size: int = 4096
    compression: str | None = None
    header_page: bytes = b""
    header_event: bytes = b""
    ftrace_formats: list[bytes] = field(default_factory=list)
    event_formats: list[tuple[str, bytes]] = field(default_factory=list)
    kallsyms: bytes = b""
    printk_formats: bytes = b""
    saved_cmdlines: bytes = b""
    cpu_count: int = 0
    options: list[tuple[int, bytes]] = field(default_factory=list)
    buffers: list[TraceBuffer] = field(default_factory=list)
    latency: bool = False

    def __post_init__(self) -> None:
        self._decompress: Callable[[bytes, int], bytes] | None = None
        _Parser(self).parse()

    @classmethod
    def from_path(cls, path: str | Path) -> TraceDat:
        try:
            stream = open(path, "rb")  # noqa: SIM115 - owned by the TraceDat, closed by close()
        except OSError as error:
            raise RecordingError(f"cannot open {str(path)!r}: {error.strerror}") from None
        try:
            return cls(stream)
        except BaseException:
            stream.close()
            raise

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> TraceDat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def option(self, option_id: int) -> bytes | None:
        """The data of the first option `option_id`, if the file has one."""
        return next((data for oid, data in self.options if oid == option_id), None)

    def option_text(self, option_id: int) -> str | None:
        """A string option (NUL-terminated ASCII) as text."""
        data = self.option(option_id)
        if data is None:
            return None
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")

    @property
    def trace_clock(self) -> str | None:
        """The trace clock the events were stamped with (`mono`, `local`...): the bracketed
        word of the TRACECLOCK option, or a buffer's clock."""
        text = self.option_text(OPTION_TRACECLOCK)
        if text:
            if "[" in text:
                return text.split("[", 1)[1].split("]", 1)[0]
            return text.strip()
        return next((b.clock for b in self.buffers if b.clock), None)

    def sub_buffers(self, buffer: TraceBuffer, cpu: CpuData) -> Iterator[bytes]:
        """One CPU's data in runs of whole sub-buffers (a run is at most ~1 MiB)."""
        if not cpu.size:
            return
        if buffer.compressed:
            yield from self._compressed_runs(cpu)
            return
        remaining, offset = cpu.size, cpu.offset
        step = max(buffer.page_size, READ_CHUNK // buffer.page_size * buffer.page_size)
        while remaining > 0:
            data = os.pread(self.stream.fileno(), min(step, remaining), offset)
            if not data:
                raise RecordingError(
                    f"cpu {cpu.cpu}: the file ends at byte {offset}, {remaining} bytes before "
                    "the end of its data"
                )
            offset += len(data)
            remaining -= len(data)
            yield data

    def _compressed_runs(self, cpu: CpuData) -> Iterator[bytes]:
        decompress = self._decompress
        if decompress is None:
            raise RecordingError("compressed data in a file that names no compression")
        fd = self.stream.fileno()
        order = "<" if self.byteorder == "little" else ">"
        (count,) = struct.unpack(order + "I", _pread_exact(fd, 4, cpu.offset))
        offset = cpu.offset + 4
        for _ in range(count):
            compressed_size, size = struct.unpack(order + "II", _pread_exact(fd, 8, offset))
            offset += 8
            yield decompress(_pread_exact(fd, compressed_size, offset), size)
            offset += compressed_size


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise RecordingError(f"the file ends inside the {size} bytes at byte {offset}")
    return data


def decompressor(name: str) -> Callable[[bytes, int], bytes]:
    """`decompress(data, size)` for a trace.dat compression algorithm (`zlib`, `zstd`)."""
    if name == "zlib":
        return lambda data, size: zlib.decompress(data)
    if name == "zstd":
        try:
            import zstandard
        except ImportError:
            raise RecordingError(
                "the file is compressed with zstd and the zstandard module is missing",
                hint="pip install zstandard",
            ) from None
        context = zstandard.ZstdDecompressor()
        return lambda data, size: context.decompress(data, max_output_size=size)
    raise RecordingError(
        f"the file is compressed with {name!r}, which this reader does not know",
        hint="convert it: trace-cmd convert --file-version 6 -i FILE -o COPY",
    )


class _Parser:
    """Reads a TraceDat's header, texts, options and buffer tables from its stream."""

    def __init__(self, dat: TraceDat) -> None:
        self.dat = dat
        self.stream = dat.stream
        self.order = "<"

    # -- primitives ------------------------------------------------------------------------

    def read(self, size: int, what: str) -> bytes:
        at = self.stream.tell()
        data = self.stream.read(size)
        if len(data) != size:
            raise RecordingError(f"the file ends at byte {at + len(data)} inside {what}")
        return data

    def number(self, size: int, what: str) -> int:
        code = {2: "H", 4: "I", 8: "Q"}[size]
        return int(struct.unpack(self.order + code, self.read(size, what))[0])

    def string(self, what: str) -> bytes:
        chunks = bytearray()
        while True:
            byte = self.stream.read(1)
            if not byte:
                raise RecordingError(f"the file ends inside {what}")
            if byte == b"\0":
                return bytes(chunks)
            chunks += byte

    def sized(self, size_bytes: int, what: str) -> bytes:
        return self.read(self.number(size_bytes, f"the size of {what}"), what)

    # -- the file --------------------------------------------------------------------------

    def parse(self) -> None:
        dat = self.dat
        head = self.stream.read(len(MAGIC))
        if head != MAGIC:
            raise RecordingError(
                "not a trace.dat file: it does not start with trace-cmd's magic",
                hint="probescope report reads files of `probescope record` and `trace-cmd record`",
            )
        version = self.string("the file version")
        if not version.isdigit() or int(version) not in (6, 7):
            raise RecordingError(
                f"trace.dat version {version.decode('ascii', 'replace')!r} is not 6 or 7",
                hint="trace-cmd convert --file-version 6 turns it into one this reader knows",
            )
        dat.version = int(version)
        endian, dat.long_size = self.read(2, "the byte order and long size")
        dat.byteorder = "big" if endian else "little"
        self.order = ">" if endian else "<"
        dat.page_size = self.number(4, "the page size")
        if dat.version == 6:
            self.parse_v6()
        else:
            self.parse_v7()

    def parse_v6(self) -> None:
        dat = self.dat
        self.header_info()
        self.ftrace_events()
        self.event_formats()
        dat.kallsyms = self.sized(4, "kallsyms")
        dat.printk_formats = self.sized(4, "printk formats")
        dat.saved_cmdlines = self.sized(8, "saved_cmdlines")
        dat.cpu_count = self.number(4, "the CPU count")
        kind = self.read(10, "the data kind")
        if kind.startswith(b"options"):
            while True:
                option_id = self.number(2, "an option id")
                if option_id == OPTION_DONE:
                    break
                data = self.sized(4, f"option {option_id}")
                dat.options.append((option_id, data))
            kind = self.read(10, "the data kind")
        if kind.startswith(b"latency"):
            dat.latency = True
            return
        if not kind.startswith(b"flyrecord"):
            raise RecordingError(f"expected 'flyrecord' or 'latency', found {kind!r}")
        clock = dat.trace_clock
        dat.buffers.append(TraceBuffer("", self.cpu_table(dat.cpu_count), clock, dat.page_size))
        for option_id, data in list(dat.options):
            if option_id == OPTION_BUFFER:
                offset = struct.unpack_from(self.order + "Q", data)[0]
                name = data[8:].split(b"\0", 1)[0].decode("utf-8", "replace")
                self.stream.seek(offset)
                if not self.read(10, "a buffer's data kind").startswith(b"flyrecord"):
                    raise RecordingError(f"buffer {name!r}: no flyrecord at byte {offset}")
                cpus = self.cpu_table(dat.cpu_count)
                dat.buffers.append(TraceBuffer(name, cpus, clock, dat.page_size))

    def cpu_table(self, count: int) -> tuple[CpuData, ...]:
        cpus = []
        for cpu in range(count):
            offset = self.number(8, f"cpu {cpu}'s data offset")
            size = self.number(8, f"cpu {cpu}'s data size")
            cpus.append(CpuData(cpu, offset, size))
        return tuple(cpus)

    def header_info(self) -> None:
        if self.read(12, "header_page's name") != b"header_page\0":
            raise RecordingError("the file has no header_page where version 6 puts it")
        self.dat.header_page = self.sized(8, "header_page")
        if self.read(13, "header_event's name") != b"header_event\0":
            raise RecordingError("the file has no header_event after its header_page")
        self.dat.header_event = self.sized(8, "header_event")

    def ftrace_events(self) -> None:
        count = self.number(4, "the count of ftrace formats")
        self.dat.ftrace_formats = [self.sized(8, "an ftrace format") for _ in range(count)]

    def event_formats(self) -> None:
        systems = self.number(4, "the count of event systems")
        for _ in range(systems):
            system = self.string("a system name").decode("utf-8", "replace")
            count = self.number(4, f"the count of {system} formats")
            for _ in range(count):
                self.dat.event_formats.append((system, self.sized(8, f"a {system} format")))

    # -- version 7 -------------------------------------------------------------------------

    def parse_v7(self) -> None:
        dat = self.dat
        name = self.string("the compression name").decode("ascii", "replace")
        self.string("the compression version")
        if name != "none":
            dat.compression = name
            dat._decompress = decompressor(name)
        offset = self.number(8, "the offset of the options")
        sections: dict[int, int] = {}
        seen: set[int] = set()
        while offset and offset not in seen:
            seen.add(offset)
            offset = self.options_section(offset, sections)
        parsers = {
            OPTION_HEADER_INFO: self.header_info,
            OPTION_FTRACE_EVENTS: self.ftrace_events,
            OPTION_EVENT_FORMATS: self.event_formats,
            OPTION_KALLSYMS: lambda: setattr(dat, "kallsyms", self.sized(4, "kallsyms")),
            OPTION_PRINTK: lambda: setattr(dat, "printk_formats", self.sized(4, "printk")),
            OPTION_CMDLINES: lambda: setattr(dat, "saved_cmdlines", self.sized(8, "cmdlines")),
        }
        for option_id, parse in parsers.items():
            if option_id in sections:
                self.section(sections[option_id], option_id, parse)
        if dat.cpu_count == 0:
            dat.cpu_count = max((len(b.cpus) for b in dat.buffers), default=0)

    def section(self, offset: int, expected: int, parse: Callable[[], object]) -> None:
        """Run `parse` over the body of the section at `offset` (decompressed if need be)."""
        self.stream.seek(offset)
        section_id = self.number(2, "a section id")
        flags = self.number(2, "a section's flags")
        self.number(4, "a section's name")
        size = self.number(8, "a section's size")
        if section_id != expected:
            raise RecordingError(
                f"the section at byte {offset} is of id {section_id}, option {expected} "
                "pointed at it"
            )
        if not flags & SECTION_COMPRESSED:
            parse()
            return
        compressed_size = self.number(4, "a compressed section's size")
        plain_size = self.number(4, "a section's uncompressed size")
        data = self.read(min(compressed_size, size), "a compressed section")
        if self.dat._decompress is None:
            raise RecordingError(f"section {section_id} is compressed, the file names no method")
        plain = self.dat._decompress(data, plain_size)
        outer = self.stream
        try:
            self.stream = io.BytesIO(plain)
            parse()
        finally:
            self.stream = outer

    def options_section(self, offset: int, sections: dict[int, int]) -> int:
        """Read the options section at `offset`; return the next one's offset (0: none)."""
        following = 0

        def parse() -> None:
            nonlocal following
            while True:
                option_id = self.number(2, "an option id")
                data = self.sized(4, f"option {option_id}")
                if option_id == OPTION_DONE:
                    following = struct.unpack_from(self.order + "Q", data)[0] if data else 0
                    return
                self.dat.options.append((option_id, data))
                if OPTION_HEADER_INFO <= option_id <= OPTION_CMDLINES and len(data) >= 8:
                    sections[option_id] = struct.unpack_from(self.order + "Q", data)[0]
                elif option_id == OPTION_BUFFER:
                    self.dat.buffers.append(self.buffer_option(data))
                elif option_id == OPTION_BUFFER_TEXT:
                    self.dat.latency = True
                elif option_id == OPTION_CPUCOUNT and len(data) >= 4:
                    self.dat.cpu_count = struct.unpack_from(self.order + "I", data)[0]

        self.section(offset, OPTION_DONE, parse)
        return following

    def buffer_option(self, data: bytes) -> TraceBuffer:
        order = self.order
        (section_offset,) = struct.unpack_from(order + "Q", data)
        at = 8
        name, at = _cstring(data, at)
        clock, at = _cstring(data, at)
        page_size, count = struct.unpack_from(order + "II", data, at)
        at += 8
        cpus = []
        for _ in range(count):
            cpu, offset, size = struct.unpack_from(order + "IQQ", data, at)
            at += 20
            cpus.append(CpuData(cpu, offset, size))
        compressed = False
        here = self.stream.tell()
        try:
            self.stream.seek(section_offset + 2)
            compressed = bool(self.number(2, "a buffer section's flags") & SECTION_COMPRESSED)
        finally:
            self.stream.seek(here)
        return TraceBuffer(name, tuple(cpus), clock or None, page_size, compressed)


def _cstring(data: bytes, at: int) -> tuple[str, int]:
    end = data.find(b"\0", at)
    if end < 0:
        raise RecordingError("a buffer option's string is not terminated")
    return data[at:end].decode("utf-8", "replace"), end + 1
