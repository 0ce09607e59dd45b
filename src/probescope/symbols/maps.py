"""Which file a process mapped where, in the symbols layer's terms: the mappings of a binary,
the runtime address of a file offset (and back), and a path through which a mapped file opens.

The maps lines themselves are system/maps.py's; here they are matched against files. The kernel
places a uprobe at `offset_to_vaddr`: in every mapping of the probed inode with
`pgoff ≤ offset < pgoff + (end − start)`, the address is `start + offset − pgoff`. The same rule,
run backwards, turns an address seen in a process (a backtrace, a `dlsym` result) into the file
offset a uprobe takes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from probescope.errors import SymbolError
from probescope.symbols.identity import FileIdentity, stat_identity
from probescope.system.maps import Mapping, mapping_at, read_maps
from probescope.system.procfs import process_root

Target = str | os.PathLike[str] | FileIdentity | tuple[int, int]


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


def map_files_path(pid: int | str, mapping: Mapping) -> str | None:
    """`/proc/PID/map_files/START-END` when it reaches the mapped inode (it does for a file
    deleted since it was mapped, a library upgraded under a running process; the kernel follows
    the magic link when a uprobe names it), else None."""
    path = f"/proc/{pid}/map_files/{mapping.start:x}-{mapping.end:x}"
    identity = stat_identity(path)
    return path if identity is not None and identity.inode == mapping.inode else None


def mapped_file(pid: int | str, mapping: Mapping, root: str | None = None) -> str | None:
    """A path that opens the file `mapping` shows: mapped_file_path's, else its map_files
    link, else None. ProcessError when `root` is not given and the process is gone."""
    return mapped_file_path(pid, mapping, root) or map_files_path(pid, mapping)


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


def file_offset_of_address(
    pid: int | str, address: int, maps: Sequence[Mapping] | None = None
) -> tuple[Mapping, int] | None:
    """(mapping, file offset) of a runtime address that lies in a file mapping, else None."""
    mapping = mapping_at(read_maps(pid) if maps is None else maps, address)
    if mapping is None or not mapping.is_file:
        return None
    return mapping, mapping.file_offset_of(address)
