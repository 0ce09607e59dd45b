"""The dynamic linker's debugger rendezvous (glibc elf/rtld-debugger-interface.txt).

`struct r_debug {int r_version; struct link_map *r_map; ElfW(Addr) r_brk; int r_state;
ElfW(Addr) r_ldbase}`: ld.so calls `r_brk` (`_dl_debug_state`) whenever `r_state` changes, so a
breakpoint there tells us when dlopen/dlclose finished (RT_CONSISTENT). Its address comes from
the executable's DT_DEBUG entry (found through auxv AT_PHDR) once ld.so has started, or from
ld.so's own `_r_debug`/`_dl_debug_state` symbols before that (at the exec stop): symbols/linker.py
finds both.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from probescope.engines.ptrace.memory import TraceeMemory
from probescope.errors import ProcessError
from probescope.symbols.linker import dt_debug, rendezvous_symbols
from probescope.symbols.maps import mapped_file
from probescope.system import procfs
from probescope.system.maps import Mapping

RT_CONSISTENT = 0
RT_ADD = 1
RT_DELETE = 2
_MAX_OBJECTS = 4096


@dataclass
class Rendezvous:
    """Where the linker reports to, and the objects it listed last time."""

    r_brk: int
    r_debug: int | None
    objects: frozenset[tuple[int, str]] = field(default_factory=frozenset)

    def state(self, memory: TraceeMemory) -> int | None:
        if self.r_debug is None:
            return None
        data = memory.read_exact(self.r_debug + 24, 4)
        return None if data is None else int(struct.unpack("<i", data)[0])

    def loaded_objects(self, memory: TraceeMemory) -> frozenset[tuple[int, str]]:
        """(l_addr, l_name) of every link_map entry, walking r_map."""
        if self.r_debug is None:
            return frozenset()
        entry = memory.read_word(self.r_debug + 8)
        seen: set[tuple[int, str]] = set()
        visited: set[int] = set()
        while entry and entry not in visited and len(visited) < _MAX_OBJECTS:
            visited.add(entry)
            head = memory.read_exact(entry, 32)
            if head is None:
                break
            l_addr, l_name, _l_ld, l_next = struct.unpack("<QQQQ", head)
            name = memory.read_string(l_name, 4096) if l_name else None
            seen.add((l_addr, name[0].decode("utf-8", "surrogateescape") if name else ""))
            entry = l_next
        return frozenset(seen)

    def changed(self, memory: TraceeMemory) -> bool:
        """Whether the link_map list differs from the last call's (updates it)."""
        objects = self.loaded_objects(memory)
        if objects == self.objects:
            return False
        self.objects = objects
        return True


def from_dt_debug(pid: int, memory: TraceeMemory, auxv: dict[int, int]) -> Rendezvous | None:
    """r_debug through the executable's DT_DEBUG (set by ld.so during start-up)."""
    phdr = auxv.get(procfs.AT_PHDR)
    phnum = auxv.get(procfs.AT_PHNUM)
    if not phdr or not phnum:
        return None
    r_debug = dt_debug(memory.read_exact, phdr, phnum)
    if r_debug is None:
        return None
    r_brk = memory.read_word(r_debug + 16)
    return Rendezvous(r_brk=r_brk, r_debug=r_debug) if r_brk else None


def from_interpreter(pid: int, auxv: dict[int, int], mappings: list[Mapping]) -> Rendezvous | None:
    """r_debug and r_brk from ld.so's exported `_r_debug` and `_dl_debug_state`."""
    base = auxv.get(procfs.AT_BASE)
    if not base:
        return None
    interpreter = next((m for m in mappings if m.start == base and m.offset == 0), None)
    if interpreter is None:
        return None
    try:
        path = mapped_file(pid, interpreter)
    except ProcessError:
        return None
    symbols = None if path is None else rendezvous_symbols(path)
    if symbols is None:
        return None
    return Rendezvous(
        r_brk=base + symbols.r_brk,
        r_debug=None if symbols.r_debug is None else base + symbols.r_debug,
    )
