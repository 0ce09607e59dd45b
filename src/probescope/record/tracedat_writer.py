"""trace-cmd's trace.dat, version 6, written: what `trace-cmd report` and KernelShark read.

The layout follows trace-cmd's `trace-cmd.dat.v6` man page field by field (see `tracedat`):
header, self-descriptions, options, then `flyrecord` with each CPU's sub-buffers page-aligned
and unchanged. Version 6 because it is one sequential layout that every trace-cmd since 2.x
reads and `trace-cmd convert` turns into version 7; the CPU data is what costs, and it is
copied kernel-side (`copy_file_range`) from the files the recorder filled.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Literal

from probescope.errors import RecordingError
from probescope.record.tracedat import MAGIC

COPY_CHUNK = 1 << 24


@dataclass(frozen=True)
class CpuSource:
    """One CPU's sub-buffers: `size` bytes of the open file `fd` from `offset`, or `data`."""

    fd: int = -1
    size: int = 0
    offset: int = 0
    data: bytes = b""

    @property
    def length(self) -> int:
        return len(self.data) if self.fd < 0 else self.size


@dataclass
class TraceDatContents:
    """Everything of a trace.dat but its CPU data: the kernel's files as bytes, and options
    as (id, data) in the order to write them."""

    header_page: bytes
    header_event: bytes
    ftrace_formats: Sequence[bytes] = ()
    event_formats: Sequence[tuple[str, bytes]] = ()
    kallsyms: bytes = b""
    printk_formats: bytes = b""
    saved_cmdlines: bytes = b""
    options: list[tuple[int, bytes]] = field(default_factory=list)
    page_size: int = 4096
    long_size: int = 8
    byteorder: Literal["little", "big"] = sys.byteorder


def write_tracedat(stream: IO[bytes], contents: TraceDatContents, cpus: Sequence[CpuSource]) -> int:
    """Write a version 6 trace.dat of `contents` and the CPU data of `cpus` (index = CPU) to
    the seekable binary `stream`; returns the file's size."""
    order = "<" if contents.byteorder == "little" else ">"
    out = bytearray()

    def number(size: int, value: int) -> None:
        out.extend(struct.pack(order + {2: "H", 4: "I", 8: "Q"}[size], value))

    def sized(size: int, data: bytes) -> None:
        number(size, len(data))
        out.extend(data)

    out += MAGIC + b"6\0"
    out += bytes([0 if contents.byteorder == "little" else 1, contents.long_size])
    number(4, contents.page_size)
    out += b"header_page\0"
    sized(8, contents.header_page)
    out += b"header_event\0"
    sized(8, contents.header_event)
    number(4, len(contents.ftrace_formats))
    for text in contents.ftrace_formats:
        sized(8, text)
    systems: dict[str, list[bytes]] = {}
    for system, text in contents.event_formats:
        systems.setdefault(system, []).append(text)
    number(4, len(systems))
    for system, texts in systems.items():
        out += system.encode() + b"\0"
        number(4, len(texts))
        for text in texts:
            sized(8, text)
    sized(4, contents.kallsyms)
    sized(4, contents.printk_formats)
    sized(8, contents.saved_cmdlines)
    number(4, len(cpus))
    if contents.options:
        out += b"options  \0"
        for option_id, data in contents.options:
            if not 0 < option_id < 1 << 16:
                raise RecordingError(f"option id {option_id} is not a non-zero 16-bit number")
            number(2, option_id)
            sized(4, data)
        number(2, 0)
    out += b"flyrecord\0"
    table_at = len(out)
    out += bytes(16 * len(cpus))
    page = contents.page_size
    offsets = []
    position = len(out)
    for cpu in cpus:
        position = -(-position // page) * page
        offsets.append(position)
        position += cpu.length
    for index, (cpu, offset) in enumerate(zip(cpus, offsets, strict=True)):
        struct.pack_into(order + "QQ", out, table_at + 16 * index, offset, cpu.length)
    stream.seek(0)
    stream.write(out)
    stream.flush()
    for cpu, offset in zip(cpus, offsets, strict=True):
        stream.seek(offset)
        if cpu.fd < 0:
            stream.write(cpu.data)
        else:
            stream.flush()
            _copy(cpu, stream.fileno(), offset)
    stream.seek(0, os.SEEK_END)
    end = max(stream.tell(), position)
    stream.truncate(end)
    stream.flush()
    return end


def _copy(cpu: CpuSource, target: int, offset: int) -> None:
    """Copy a CPU's data into the output, kernel-side when the file systems allow."""
    done = 0
    while done < cpu.size:
        want = min(COPY_CHUNK, cpu.size - done)
        try:
            copied = os.copy_file_range(cpu.fd, target, want, cpu.offset + done, offset + done)
        except OSError:
            copied = 0
        if copied <= 0:
            data = os.pread(cpu.fd, want, cpu.offset + done)
            if not data:
                raise RecordingError(
                    f"the recorder's file ended {cpu.size - done} bytes short of its data"
                )
            copied = os.pwrite(target, data, offset + done)
        done += copied
