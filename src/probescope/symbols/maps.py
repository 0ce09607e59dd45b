"""`/proc/PID/maps`: which file bytes a process mapped where, and file offset ↔ runtime address.

The kernel places a uprobe at `offset_to_vaddr`: in every mapping of the probed inode with
`pgoff ≤ offset < pgoff + (end − start)`, the address is `start + offset − pgoff`. The same rule,
run backwards, turns an address seen in a process (a backtrace, a `dlsym` result) into the file
offset a uprobe takes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from probescope.errors import SymbolError
from probescope.symbols.identity import FileIdentity, stat_identity

Target = str | os.PathLike[str] | FileIdentity | tuple[int, int]


class Mapping(NamedTuple):
    """One line of `/proc/PID/maps`. `offset` is the kernel's pgoff in bytes, `path` the
    pathname as the process sees it (None for anonymous memory; `[heap]`, `[vdso]` … kept)."""

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
        return "x" in self.perms

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path is not None and not self.path.startswith("[")

    def contains_address(self, address: int) -> bool:
        return self.start <= address < self.end

    def contains_file_offset(self, file_offset: int) -> bool:
        return self.offset <= file_offset < self.offset + (self.end - self.start)

    def address_of(self, file_offset: int) -> int:
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
        if len(fields) < 5:
            raise SymbolError(f"unexpected line {number} in a maps file: {line!r}")
        try:
            start_text, end_text = fields[0].split("-")
            major, minor = fields[3].split(":")
            start, end = int(start_text, 16), int(end_text, 16)
            offset = int(fields[2], 16)
            device = os.makedev(int(major, 16), int(minor, 16))
            inode = int(fields[4])
        except ValueError:
            raise SymbolError(f"unexpected line {number} in a maps file: {line!r}") from None
        path = fields[5] if len(fields) > 5 else None
        deleted = False
        if path is not None and inode and path.endswith(" (deleted)"):
            path, deleted = path[: -len(" (deleted)")], True
        mappings.append(Mapping(start, end, fields[1], offset, device, inode, path, deleted))
    return mappings


def read_maps(pid: int | str = "self") -> list[Mapping]:
    """The mappings of process `pid` (or `"self"`)."""
    try:
        with open(f"/proc/{pid}/maps") as stream:
            text = stream.read()
    except FileNotFoundError:
        raise SymbolError(
            f"no process with pid {pid}", hint="check the pid (it may have exited)"
        ) from None
    except PermissionError:
        raise SymbolError(
            f"cannot read /proc/{pid}/maps: permission denied",
            hint="inspecting another user's process needs root (or CAP_SYS_PTRACE)",
        ) from None
    return parse_maps(text)


def process_root(pid: int | str) -> str:
    """The path prefix through which probescope sees files as process `pid` sees them.

    `""` when the process shares probescope's root directory, else `/proc/PID/root`.
    """
    root = f"/proc/{pid}/root"
    ours, theirs = stat_identity("/"), stat_identity(root)
    if theirs is None:
        if not os.path.exists(f"/proc/{pid}"):
            raise SymbolError(f"no process with pid {pid}", hint="check the pid")
        raise SymbolError(
            f"cannot open {root}: permission denied",
            hint="looking into another user's process needs root (or CAP_SYS_PTRACE)",
        )
    if ours is not None and ours.key == theirs.key:
        return ""
    return root


def mapped_file_path(pid: int | str, mapping: Mapping, root: str | None = None) -> str | None:
    """A path through which probescope can open the file `mapping` shows, or None.

    The kernel prints maps paths relative to the *reader's* root when it can reach the file
    (a chroot inside our mount namespace: the host path) and relative to the process's own
    root otherwise (a container's mount namespace: `root + path`); the inode decides.
    """
    if mapping.path is None or not mapping.inode:
        return None
    if root is None:
        root = process_root(pid)
    candidates = [root + mapping.path, mapping.path] if root else [mapping.path]
    found = [(c, stat_identity(c)) for c in candidates]
    for exact in (True, False):
        for candidate, identity in found:
            if identity is None or identity.inode != mapping.inode:
                continue
            if not exact or identity.device == mapping.device:
                return candidate
    return None


class _Matcher:
    """Decides whether a mapping shows the target file.

    (device, inode) equal is a match. Otherwise the file the mapping names is stat'ed (through
    the process's root and directly) and compared with the target's identity: btrfs subvolumes
    report another device in maps than in stat, and overlayfs maps show the real file's device
    and inode while stat through the overlay shows its own. That fallback is tried for mappings
    with the same inode, or — when the target is a path — the same file name.
    """

    def __init__(self, pid: int | str, target: Target) -> None:
        self.pid = pid
        self.name: str | None = None
        if isinstance(target, FileIdentity):
            self.key = target.key
        elif isinstance(target, tuple):
            self.key = (int(target[0]), int(target[1]))
        else:
            identity = stat_identity(target)
            if identity is None:
                raise SymbolError(f"cannot stat {os.fspath(target)!r}")
            self.key = identity.key
            self.name = os.path.basename(os.fspath(target))
        self._root: str | None = None
        self._verdicts: dict[tuple[int, int, str], bool] = {}

    def __call__(self, mapping: Mapping) -> bool:
        device, inode = self.key
        if mapping.inode == inode and mapping.device == device:
            return True
        if mapping.path is None:
            return False
        if mapping.inode != inode and os.path.basename(mapping.path) != self.name:
            return False
        cached = (mapping.device, mapping.inode, mapping.path)
        if cached not in self._verdicts:
            if self._root is None:
                self._root = f"/proc/{self.pid}/root"
            seen = [stat_identity(self._root + mapping.path), stat_identity(mapping.path)]
            self._verdicts[cached] = any(s is not None and s.key == self.key for s in seen)
        return self._verdicts[cached]


def mappings_of(
    pid: int | str, target: Target, maps: Sequence[Mapping] | None = None
) -> list[Mapping]:
    """The mappings of `target` (a path, a FileIdentity or a (device, inode) pair) in `pid`."""
    matches = _Matcher(pid, target)
    return [m for m in (read_maps(pid) if maps is None else maps) if m.inode and matches(m)]


def runtime_addresses(
    pid: int | str,
    target: Target,
    file_offset: int,
    maps: Sequence[Mapping] | None = None,
) -> list[int]:
    """Every address at which byte `file_offset` of `target` is mapped in `pid` (may be none)."""
    return [
        m.address_of(file_offset)
        for m in mappings_of(pid, target, maps)
        if m.contains_file_offset(file_offset)
    ]


def runtime_address(
    pid: int | str,
    target: Target,
    file_offset: int,
    maps: Sequence[Mapping] | None = None,
) -> int:
    """The address of `file_offset` of `target` in `pid`, preferring an executable mapping.

    Raises SymbolError when the file, or that part of it, is not mapped.
    """
    mapped = mappings_of(pid, target, maps)
    name = target if isinstance(target, str) else f"file {target}"
    if not mapped:
        raise SymbolError(
            f"{name} is not mapped in process {pid}",
            hint="it may not be loaded yet (dlopen) — uprobes still apply when it is",
        )
    covering = [m for m in mapped if m.contains_file_offset(file_offset)]
    if not covering:
        ranges = ", ".join(f"{m.offset:#x}-{m.offset + m.size:#x}" for m in mapped)
        raise SymbolError(
            f"file offset {file_offset:#x} of {name} is not mapped in process {pid}",
            hint=f"mapped file ranges: {ranges}",
        )
    covering.sort(key=lambda m: not m.executable)
    return covering[0].address_of(file_offset)


def mapping_at(
    pid: int | str, address: int, maps: Sequence[Mapping] | None = None
) -> Mapping | None:
    """The mapping that holds `address` in `pid`, or None."""
    for mapping in read_maps(pid) if maps is None else maps:
        if mapping.contains_address(address):
            return mapping
    return None


def file_offset_of_address(
    pid: int | str, address: int, maps: Sequence[Mapping] | None = None
) -> tuple[Mapping, int] | None:
    """(mapping, file offset) of a runtime address that lies in a file mapping, else None."""
    mapping = mapping_at(pid, address, maps)
    if mapping is None or not mapping.is_file:
        return None
    return mapping, mapping.file_offset_of(address)
