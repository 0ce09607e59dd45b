"""The dynamic linker's debugger rendezvous (glibc elf/rtld-debugger-interface.txt).

`struct r_debug {int r_version; struct link_map *r_map; ElfW(Addr) r_brk; int r_state;
ElfW(Addr) r_ldbase}`: ld.so calls `r_brk` (`_dl_debug_state`) whenever `r_state` changes, so a
breakpoint there tells us when dlopen/dlclose finished (RT_CONSISTENT). Its address comes from
the executable's DT_DEBUG entry (found through auxv AT_PHDR) once ld.so has started, or from
ld.so's own `_r_debug`/`_dl_debug_state` symbols before that (at the exec stop).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from probescope.engines.ptrace.memory import TraceeMemory
from probescope.system import procfs
from probescope.system.maps import Mapping

RT_CONSISTENT = 0
RT_ADD = 1
RT_DELETE = 2
DT_NULL = 0
DT_DEBUG = 21
PT_DYNAMIC = 2
PT_PHDR = 6
_PHDR_SIZE = 56
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
    table = memory.read_exact(phdr, phnum * _PHDR_SIZE)
    if table is None:
        return None
    headers = [struct.unpack_from("<IIQQQQQQ", table, i * _PHDR_SIZE) for i in range(phnum)]
    bias = None
    for p_type, _, _, p_vaddr, *_ in headers:
        if p_type == PT_PHDR:
            bias = phdr - p_vaddr
    if bias is None:
        return None
    for p_type, _, _, p_vaddr, _, _, p_memsz, _ in headers:
        if p_type != PT_DYNAMIC:
            continue
        dynamic = memory.read_exact(bias + p_vaddr, p_memsz)
        if dynamic is None:
            return None
        for i in range(0, len(dynamic) - 15, 16):
            tag, value = struct.unpack_from("<qQ", dynamic, i)
            if tag == DT_NULL:
                break
            if tag == DT_DEBUG and value:
                r_brk = memory.read_word(value + 16)
                if r_brk:
                    return Rendezvous(r_brk=r_brk, r_debug=value)
    return None


def from_interpreter(pid: int, auxv: dict[int, int], mappings: list[Mapping]) -> Rendezvous | None:
    """r_debug and r_brk from ld.so's exported `_r_debug` and `_dl_debug_state`."""
    base = auxv.get(procfs.AT_BASE)
    if not base:
        return None
    interpreter = next((m for m in mappings if m.start == base and m.offset == 0), None)
    path = None if interpreter is None else interpreter.path
    if path is None or not path.startswith("/"):
        return None
    symbols = _linker_symbols(f"/proc/{pid}/root{path}")
    if symbols is None:
        symbols = _linker_symbols(path)
    if symbols is None or "_dl_debug_state" not in symbols:
        return None
    r_debug = symbols.get("_r_debug")
    return Rendezvous(
        r_brk=base + symbols["_dl_debug_state"],
        r_debug=base + r_debug if r_debug is not None else None,
    )


_symbol_cache: dict[tuple[str, int, int], dict[str, int] | None] = {}


def _linker_symbols(path: str) -> dict[str, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    cache_key = (path, st.st_ino, st.st_dev)
    if cache_key in _symbol_cache:
        return _symbol_cache[cache_key]
    found: dict[str, int] | None = None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynsym = elf.get_section_by_name(".dynsym")
            if isinstance(dynsym, SymbolTableSection):
                found = {}
                for symbol in dynsym.iter_symbols():
                    if symbol.name in ("_dl_debug_state", "_r_debug") and symbol["st_value"]:
                        found[symbol.name] = symbol["st_value"]
    except (OSError, ELFError):
        found = None
    _symbol_cache[cache_key] = found
    return found
