"""Segment: one ELF program header, the unit that maps link-time addresses to file offsets.

Apart from elfimage.py so that a table loaded from the cache, which keeps its PT_LOADs, does not
import the ELF reader.
"""

from __future__ import annotations

from typing import NamedTuple

PT_LOAD, PT_DYNAMIC, PT_NOTE = 1, 2, 4
PF_X, PF_W, PF_R = 1, 2, 4


class Segment(NamedTuple):
    """One program header (`PT_LOAD`, `PT_NOTE`, ...)."""

    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int

    @property
    def executable(self) -> bool:
        return bool(self.flags & PF_X)

    def contains_vaddr(self, vaddr: int) -> bool:
        return self.vaddr <= vaddr < self.vaddr + self.filesz

    def contains_offset(self, offset: int) -> bool:
        return self.offset <= offset < self.offset + self.filesz
