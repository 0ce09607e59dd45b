"""`/proc/PID/maps`: which file bytes a process mapped where — the one Mapping and its parser.

The kernel places a uprobe at `offset_to_vaddr`: in every mapping of the probed inode with
`pgoff ≤ offset < pgoff + (end − start)`, the address is `start + offset − pgoff`. The same rule,
run backwards, turns an address seen in a process (a backtrace, a `dlsym` result) into the file
offset a uprobe takes. Which *file* a mapping shows, as probescope can open it, is the symbols
layer's question (symbols/maps.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from probescope.errors import ProcessError

_DELETED = " (deleted)"


class Mapping(NamedTuple):
    """One line of `/proc/PID/maps`. `offset` is the kernel's pgoff in bytes, `device` the
    dev_t of `major:minor`, `path` the pathname as the process sees it (None for anonymous
    memory; `[heap]`, `[vdso]` … kept); `deleted` when the kernel marked the file ` (deleted)`."""

    start: int
    end: int
    perms: str
    offset: int
    device: int
    inode: int
    path: str | None
    deleted: bool = False

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def executable(self) -> bool:
        return self.perms[2] == "x"

    @property
    def writable(self) -> bool:
        return self.perms[1] == "w"

    @property
    def private(self) -> bool:
        return self.perms[3] == "p"

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path is not None and not self.path.startswith("[")

    @property
    def file_key(self) -> tuple[int, int]:
        """(device, inode): the file this mapping shows, as FileIdentity.key and stat see it."""
        return self.device, self.inode

    def contains_address(self, address: int) -> bool:
        return self.start <= address < self.end

    def contains_file_offset(self, file_offset: int) -> bool:
        return self.offset <= file_offset < self.offset + (self.end - self.start)

    def address_of(self, file_offset: int) -> int:
        """The kernel's offset_to_vaddr for a file offset inside this mapping."""
        return self.start + file_offset - self.offset

    def file_offset_of(self, address: int) -> int:
        return address - self.start + self.offset


def parse_maps(text: str) -> list[Mapping]:
    """Parse the text of a maps file (`start-end perms pgoff major:minor inode [path]`)."""
    mappings = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        fields = line.split(None, 5)
        if len(fields) < 5 or len(fields[1]) != 4:
            raise ProcessError(f"unexpected line {number} in a maps file: {line!r}")
        try:
            start_text, end_text = fields[0].split("-")
            major, minor = fields[3].split(":")
            start, end = int(start_text, 16), int(end_text, 16)
            offset = int(fields[2], 16)
            device = os.makedev(int(major, 16), int(minor, 16))
            inode = int(fields[4])
        except ValueError:
            raise ProcessError(f"unexpected line {number} in a maps file: {line!r}") from None
        path = fields[5] if len(fields) > 5 else None
        deleted = False
        if path is not None and inode and path.endswith(_DELETED):
            path, deleted = path[: -len(_DELETED)], True
        mappings.append(Mapping(start, end, fields[1], offset, device, inode, path, deleted))
    return mappings


def read_maps(pid: int | str = "self") -> list[Mapping]:
    """The mappings of process `pid` (or `"self"`); ProcessError when it cannot be read."""
    try:
        with open(f"/proc/{pid}/maps") as stream:
            text = stream.read()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessError(
            f"no process with pid {pid}", hint="check the pid (it may have exited)"
        ) from None
    except PermissionError:
        raise ProcessError(
            f"cannot read /proc/{pid}/maps: permission denied",
            hint="inspecting another user's process needs root (or CAP_SYS_PTRACE)",
        ) from None
    return parse_maps(text)


def mapping_at(maps: Sequence[Mapping], address: int) -> Mapping | None:
    """The mapping that holds `address`, or None."""
    for mapping in maps:
        if mapping.contains_address(address):
            return mapping
    return None


def gaps(mappings: Sequence[Mapping], low: int, high: int) -> Iterator[tuple[int, int]]:
    """Unmapped ranges inside [low, high), in address order."""
    cursor = low
    for m in sorted(mappings, key=lambda m: m.start):
        if m.end <= cursor:
            continue
        if m.start >= high:
            break
        if m.start > cursor:
            yield cursor, min(m.start, high)
        cursor = max(cursor, m.end)
    if cursor < high:
        yield cursor, high
