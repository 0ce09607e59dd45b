"""Where the dynamic linker's debugger rendezvous is: DT_DEBUG, `_r_debug`, `_dl_debug_state`.

glibc's ld.so calls `_dl_debug_state` (the `r_brk` of `struct r_debug`) whenever it has changed
the list of loaded objects (elf/rtld-debugger-interface.txt). Once ld.so has started, the
executable's DT_DEBUG entry holds the address of its `struct r_debug`, read here from the loaded
program headers and dynamic section; before that (at the exec stop) a debugger takes `_r_debug`
and `_dl_debug_state` from ld.so's own `.dynsym`, at its load base.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import NamedTuple

from probescope.errors import SymbolError
from probescope.symbols.elfimage import DT_NULL, ElfImage
from probescope.symbols.segment import PT_DYNAMIC

R_BRK_SYMBOL = "_dl_debug_state"
R_DEBUG_SYMBOL = "_r_debug"
DT_DEBUG = 21
PT_PHDR = 6
_PHDR = struct.Struct(
    "<IIQQQQQQ"
)  # Elf64_Phdr: type, flags, offset, vaddr, paddr, filesz, memsz, align
_DYN = struct.Struct("<qQ")  # Elf64_Dyn: tag, value


class RendezvousSymbols(NamedTuple):
    """Link-time addresses in the dynamic linker: add its load base (AT_BASE) to use them."""

    r_brk: int  # _dl_debug_state, called at each change of the link map
    r_debug: int | None  # _r_debug, the struct r_debug (None when not exported)


def rendezvous_symbols(path: str | os.PathLike[str]) -> RendezvousSymbols | None:
    """Where the dynamic linker at `path` reports to debuggers, or None when its `.dynsym`
    defines no `_dl_debug_state` (not glibc's ld.so, or not an ELF file)."""
    found: dict[str, int] = {}
    try:
        with ElfImage.from_path(path) as image:
            dynsym = image.dynsym
            if dynsym is None:
                return None
            for symbol in image.symbols(dynsym):
                if symbol.name in (R_BRK_SYMBOL, R_DEBUG_SYMBOL) and symbol.shndx and symbol.value:
                    found.setdefault(symbol.name, symbol.value)
    except SymbolError:
        return None
    if R_BRK_SYMBOL not in found:
        return None
    return RendezvousSymbols(found[R_BRK_SYMBOL], found.get(R_DEBUG_SYMBOL))


def dt_debug(read: Callable[[int, int], bytes | None], phdr: int, phnum: int) -> int | None:
    """The non-zero DT_DEBUG value of a loaded 64-bit executable (the address of ld.so's
    `struct r_debug`), or None before ld.so set it.

    `read(address, size)` reads the process's memory (None when it cannot); `phdr` and `phnum`
    are its auxv AT_PHDR and AT_PHNUM. PT_PHDR gives the load bias, PT_DYNAMIC the section.
    """
    table = read(phdr, phnum * _PHDR.size)
    if table is None or len(table) < phnum * _PHDR.size:
        return None
    headers = [_PHDR.unpack_from(table, i * _PHDR.size) for i in range(phnum)]
    bias = None
    for p_type, _, _, p_vaddr, *_ in headers:
        if p_type == PT_PHDR:
            bias = phdr - p_vaddr
    if bias is None:
        return None
    for p_type, _, _, p_vaddr, _, _, p_memsz, _ in headers:
        if p_type != PT_DYNAMIC:
            continue
        dynamic = read(bias + p_vaddr, p_memsz)
        if dynamic is None:
            return None
        for tag, value in _DYN.iter_unpack(dynamic[: len(dynamic) - len(dynamic) % _DYN.size]):
            if tag == DT_NULL:
                break
            if tag == DT_DEBUG and value:
                return int(value)
    return None
