"""Addresses to frames: which file a process had mapped at an address, and which function of
that file holds it (through `symbols/`); kernel addresses through the kernel's symbol table.

The memory maps of each traced process are read when its first stack is seen and read again
whenever an address falls outside every mapping known (a library `dlopen`ed since); the maps
last read are kept after the process exits, so stacks decoded after its end still resolve.
Frames are cached per (process, address) until that process's maps change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from probescope.aggregate.unwind import CodeLookup
from probescope.aggregate.values import Frame, Stack
from probescope.errors import ProcessError, SymbolError
from probescope.symbols.cfi import CallFrameTable, CfiRow
from probescope.symbols.maps import mapped_file
from probescope.symbols.table import SymbolTable
from probescope.system.maps import Mapping, parse_maps, read_maps

UNKNOWN_MODULE = "[unknown]"
KERNEL_MODULE = "[kernel]"


class KernelSymbolTable(Protocol):
    """What the symbolizer needs of kallsyms: (name, offset, size, module) of an address."""

    def lookup(self, address: int) -> tuple[str, int, int, str | None] | None: ...


class ProcessMaps:
    """The mappings of traced processes, every distinct set read from /proc/PID/maps kept (an
    exec replaces them all, a dlopen adds some): an address is looked up in the newest set
    first. Safe to feed from a watcher thread while the aggregating thread reads."""

    HISTORY = 16

    def __init__(self, reader: Callable[[int], list[Mapping]] = read_maps) -> None:
        self._reader = reader
        self._maps: dict[int, list[list[Mapping]]] = {}
        self._paths: dict[tuple[int, int, int], str | None] = {}
        self.generation: dict[int, int] = {}

    def read(self, pid: int) -> bool:
        """Read `pid`'s maps again; False when the process is gone (the old ones stay)."""
        try:
            maps = [m for m in self._reader(pid) if m.is_file]
        except (ProcessError, SymbolError):
            return False
        if not maps:
            return False  # a zombie: its memory is gone, keep what was read before
        history = self._maps.get(pid)
        if history is None or history[-1] != maps:
            self._maps[pid] = [*(history or [])[-(self.HISTORY - 1) :], maps]
            self.generation[pid] = self.generation.get(pid, 0) + 1
        return True

    def add_text(self, pid: int, text: str) -> None:
        """Maps read by someone else (the maps keeper at an exec or an exit)."""
        maps = [m for m in parse_maps(text) if m.is_file]
        if not maps:
            return
        history = self._maps.get(pid)
        if history is None or history[-1] != maps:
            self._maps[pid] = [*(history or [])[-(self.HISTORY - 1) :], maps]
            self.generation[pid] = self.generation.get(pid, 0) + 1

    def known(self, pid: int) -> bool:
        return pid in self._maps

    def mapping(self, pid: int, address: int) -> Mapping | None:
        if pid not in self._maps:
            self.read(pid)
        found = self._find(pid, address)
        if found is None and self.read(pid):
            found = self._find(pid, address)
        return found

    def _find(self, pid: int, address: int) -> Mapping | None:
        for maps in reversed(self._maps.get(pid, ())):
            for mapping in maps:
                if mapping.start <= address < mapping.end:
                    return mapping
        return None

    def file_path(self, pid: int, mapping: Mapping) -> str | None:
        """A path probescope can open for the mapping's file (through the process's root)."""
        key = (pid, mapping.device, mapping.inode)
        if key not in self._paths:
            try:
                path = mapped_file(pid, mapping)
            except (ProcessError, SymbolError):
                path = None
            if path is None and mapping.path and os.path.exists(mapping.path):
                path = mapping.path
            self._paths[key] = path
        return self._paths[key]


class Symbolizer:
    """Frames of user and kernel addresses, and the CFI lookups the unwinder needs."""

    def __init__(
        self, maps: ProcessMaps | None = None, kernel: KernelSymbolTable | None = None
    ) -> None:
        self.maps = maps or ProcessMaps()
        self.kernel = kernel
        self._frames: dict[tuple[int, int, bool], Frame] = {}
        self._seen_generation: dict[int, int] = {}
        self._code_files: dict[Mapping, tuple[SymbolTable, CallFrameTable] | None] = {}
        self.unresolved = 0

    def _check_generation(self, pid: int) -> None:
        generation = self.maps.generation.get(pid, 0)
        if self._seen_generation.get(pid) != generation:
            self._seen_generation[pid] = generation
            for key in [k for k in self._frames if k[0] == pid]:
                del self._frames[key]

    def user_stack(self, pid: int, pcs: Sequence[int]) -> Stack:
        """Frames of return addresses (the first is the probed pc itself)."""
        self._check_generation(pid)
        frames = []
        for depth, pc in enumerate(pcs):
            key = (pid, pc, depth == 0)
            frame = self._frames.get(key)
            if frame is None:
                frame = self._user_frame(pid, pc, exact=depth == 0)
                self._check_generation(pid)
                self._frames[key] = frame
            frames.append(frame)
        return tuple(frames)

    def _user_frame(self, pid: int, pc: int, *, exact: bool) -> Frame:
        # A return address points after its call: look up the call itself (pc - 1), so a
        # call ending a function (noreturn) is not put in the next function.
        probe = pc if exact else pc - 1
        mapping = self.maps.mapping(pid, probe)
        if mapping is None:
            self.unresolved += 1
            return Frame(f"0x{pc:x}", 0, UNKNOWN_MODULE)
        path = self.maps.file_path(pid, mapping) or mapping.path or UNKNOWN_MODULE
        file_offset = mapping.file_offset_of(probe)
        try:
            table = SymbolTable.for_path(path)
        except SymbolError:
            self.unresolved += 1
            return Frame(f"0x{pc:x}", 0, mapping.path or UNKNOWN_MODULE)
        function = table.function_at_offset(file_offset)
        if function is None:
            return Frame(f"0x{file_offset + (pc - probe):x}", 0, mapping.path or path)
        offset = file_offset - function.offset + (pc - probe)
        return Frame(function.name, offset, mapping.path or path)

    def kernel_stack(self, addresses: Sequence[int]) -> Stack:
        frames = []
        for address in addresses:
            key = (-1, address, True)
            frame = self._frames.get(key)
            if frame is None:
                frame = self._kernel_frame(address)
                self._frames[key] = frame
            frames.append(frame)
        return tuple(frames)

    def _kernel_frame(self, address: int) -> Frame:
        found = self.kernel.lookup(address) if self.kernel is not None else None
        if found is None:
            return Frame(f"0x{address:x}", 0, KERNEL_MODULE)
        name, offset, _, module = found
        return Frame(name, offset, f"[{module}]" if module else KERNEL_MODULE)

    def code_lookup(self, pid: int) -> CodeLookup:
        """The unwinder's view of process `pid`: the CFI row and load bias of a pc."""
        files = self._code_files

        def lookup(pc: int) -> tuple[CfiRow | None, int] | None:
            mapping = self.maps.mapping(pid, pc)
            if mapping is None:
                return None
            if mapping in files:
                opened = files[mapping]
            else:
                opened = files[mapping] = self._open_code(pid, mapping)
            if opened is None:
                return None
            table, frames = opened
            vaddr = table.offset_to_vaddr(mapping.file_offset_of(pc))
            if vaddr is None:
                return None
            return frames.row_at(vaddr), pc - vaddr

        return lookup

    def _open_code(self, pid: int, mapping: Mapping) -> tuple[SymbolTable, CallFrameTable] | None:
        path = self.maps.file_path(pid, mapping)
        if path is None:
            return None
        try:
            return SymbolTable.for_path(path), CallFrameTable.for_path(path)
        except SymbolError:
            return None
