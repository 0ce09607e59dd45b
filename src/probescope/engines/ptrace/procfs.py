"""What the ptrace engine reads from /proc: memory maps, auxv, thread lists, status lines."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

AT_PHDR = 3
AT_PHNUM = 5
AT_BASE = 7


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    device: tuple[int, int]
    inode: int
    path: str

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
    def size(self) -> int:
        return self.end - self.start

    def contains_offset(self, offset: int) -> bool:
        return self.offset <= offset < self.offset + self.size

    def address_of(self, offset: int) -> int:
        """The kernel's offset_to_vaddr for a file offset inside this mapping."""
        return self.start + offset - self.offset

    @property
    def file_key(self) -> tuple[int, int, int]:
        return (self.device[0], self.device[1], self.inode)


def parse_maps(text: str) -> list[Mapping]:
    mappings = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        start, _, end = parts[0].partition("-")
        major, _, minor = parts[3].partition(":")
        mappings.append(
            Mapping(
                start=int(start, 16),
                end=int(end, 16),
                perms=parts[1],
                offset=int(parts[2], 16),
                device=(int(major, 16), int(minor, 16)),
                inode=int(parts[4]),
                path=parts[5] if len(parts) > 5 else "",
            )
        )
    return mappings


def read_maps(pid: int) -> list[Mapping]:
    with open(f"/proc/{pid}/maps") as f:
        return parse_maps(f.read())


def file_key(path: str) -> tuple[int, int, int]:
    """(major, minor, inode) of a file, as /proc/PID/maps prints them."""
    st = os.stat(path)
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)


def read_auxv(pid: int) -> dict[int, int]:
    with open(f"/proc/{pid}/auxv", "rb") as f:
        data = f.read()
    values = {}
    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack_from("<QQ", data, i)
        if key == 0:
            break
        values[key] = value
    return values


def thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def status_fields(pid: int) -> dict[str, str]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except (FileNotFoundError, ProcessLookupError):
        pass
    return fields


def thread_group(tid: int) -> int | None:
    value = status_fields(tid).get("Tgid")
    return int(value) if value else None


def tracer_of(pid: int) -> int:
    return int(status_fields(pid).get("TracerPid", "0") or 0)


def shadow_stack_enabled(pid: int) -> bool:
    """x86 user shadow stack (CET shstk) active in this thread (kernel ≥ 6.6 reports it)."""
    return "shstk" in status_fields(pid).get("x86_Thread_features", "").split()


def read_comm(tid: int) -> str:
    try:
        with open(f"/proc/{tid}/comm", "rb") as f:
            return f.read().rstrip(b"\n").decode("utf-8", "surrogateescape")
    except OSError:
        return "<...>"


def gaps(mappings: list[Mapping], low: int, high: int) -> Iterator[tuple[int, int]]:
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


def ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None
