"""The layout of one ring-buffer record: a fixed header every program writes, then the
probe's arguments laid out like the kernel's uprobe record (in definition order, each its
type's size, arrays size × N, strings as `__data_loc` words whose text follows the fixed part).

    offset  size  field
    0       8     timestamp (bpf_ktime_get_ns: CLOCK_MONOTONIC, the `mono` trace clock), read
                  once the record's place in the ring is reserved
    8       8     ip: the probed address (entry) or the function's address (return)
    16      8     ret_ip: the return address in the caller (returns), else 0
    24      4     tid          } bpf_get_current_pid_tgid
    28      4     tgid         }
    32      4     probe index (the uprobe_multi cookie, or the program's constant)
    36      4     cpu
    40      16    comm at the hit (bpf_get_current_comm)
    56            arguments, then string bytes

A string word is `length << 16 | offset from the record start`; length 0 is the kernel's
`(fault)`. Tracepoint records carry the kernel's raw trace entry after the header instead.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from probescope.errors import BpfError
from probescope.language.model import FetchArg

HEADER = struct.Struct("<QQQIIII16s")
HEADER_SIZE = HEADER.size
OFF_TIMESTAMP = 0
OFF_IP = 8
OFF_RET_IP = 16
OFF_PID_TGID = 24
OFF_INDEX = 32
OFF_CPU = 36
OFF_COMM = 40
COMM_SIZE = 16

MAX_STRING_SIZE = 4096
"""The kernel's limit for one fetched string (PATH_MAX), terminating NUL included."""

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
"""All arguments of one uprobe hit share one page (MAX_UCB_BUFFER_SIZE)."""


@dataclass(frozen=True)
class ArgSlot:
    """Where one argument lives in the record."""

    arg: FetchArg
    offset: int

    @property
    def is_string(self) -> bool:
        return self.arg.type.is_string

    @property
    def elements(self) -> int:
        return self.arg.type.count or 1

    @property
    def size(self) -> int:
        """Bytes in the fixed part: 4 per string word, else the type's record size."""
        if self.is_string:
            return 4 * self.elements
        return self.arg.type.record_size


@dataclass(frozen=True)
class RecordLayout:
    slots: tuple[ArgSlot, ...]
    fixed_size: int

    @property
    def has_strings(self) -> bool:
        return any(slot.is_string for slot in self.slots)

    @property
    def strings_offset(self) -> int:
        """Where string bytes start: right after the fixed part."""
        return HEADER_SIZE + self.fixed_size

    @property
    def string_budget(self) -> int:
        """The most string bytes one hit may carry (the page minus the fixed part)."""
        return PAGE_SIZE - self.fixed_size

    @property
    def size(self) -> int:
        """The record's size without string bytes."""
        return HEADER_SIZE + self.fixed_size

    @property
    def string_sources(self) -> int:
        return sum(slot.elements for slot in self.slots if slot.is_string)


def layout_for(args: Sequence[FetchArg]) -> RecordLayout:
    slots = []
    offset = HEADER_SIZE
    for arg in args:
        slot = ArgSlot(arg, offset)
        slots.append(slot)
        offset += slot.size
    fixed = offset - HEADER_SIZE
    if fixed >= PAGE_SIZE:
        raise BpfError(
            f"the arguments take {fixed} bytes per hit; the kernel's uprobe record holds at "
            f"most {PAGE_SIZE - 1}",
            hint="fetch fewer or smaller arguments",
        )
    return RecordLayout(tuple(slots), fixed)
