"""Where exception unwinding starts and ends, so hijacked return addresses never reach an
unwinder.

An unwinder that meets our trampoline's address on the stack finds no unwind info for it and
gives up (std::terminate for C++). So when a thread enters the unwinder (`_Unwind_RaiseException`
and friends in libgcc_s, or linked statically) every hijacked return address of that thread is
put back; when the exception is caught (`__cxa_begin_catch`) the frames that survived — those
above the stack pointer — are hijacked again, and the unwound ones dropped like longjmp'd frames.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

EXPOSE = "expose"  # entering the unwinder: put every original return address back
CATCH = "catch"  # a handler caught the exception: hijack the surviving frames again

HOOKS = {
    "_Unwind_RaiseException": EXPOSE,
    "_Unwind_Resume": EXPOSE,
    "_Unwind_Resume_or_Rethrow": EXPOSE,
    "_Unwind_ForcedUnwind": EXPOSE,
    "__cxa_begin_catch": CATCH,
}
_LIBRARY_PREFIXES = ("libgcc_s", "libstdc++", "libc++abi", "libunwind")

_cache: dict[tuple[int, int], list[tuple[str, int]]] = {}


def worth_checking(path: str, is_main_executable: bool) -> bool:
    """Only the unwinder libraries and the executable (static libgcc/libstdc++) can hold them."""
    return is_main_executable or os.path.basename(path).startswith(_LIBRARY_PREFIXES)


def hooks_in(paths: list[str], key: tuple[int, int]) -> list[tuple[str, int]]:
    """(hook kind, file offset) for every unwinder entry point defined in the file, opened
    through the first of `paths` that opens."""
    if key in _cache:
        return _cache[key]
    found: dict[str, int] = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                found = _symbols(f)
        except OSError:
            continue
        break
    hooks = [(HOOKS[name], offset) for name, offset in sorted(found.items())]
    _cache[key] = hooks
    return hooks


def _symbols(f: BinaryIO) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        elf = ELFFile(f)
        loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        for table in (".dynsym", ".symtab"):
            section = elf.get_section_by_name(table)
            if not isinstance(section, SymbolTableSection):
                continue
            for symbol in section.iter_symbols():
                name = symbol.name.split("@", 1)[0]
                if name not in HOOKS or name in found or symbol["st_shndx"] == "SHN_UNDEF":
                    continue
                value = symbol["st_value"]
                for segment in loads:
                    start = segment["p_vaddr"]
                    if start <= value < start + segment["p_filesz"]:
                        found[name] = value - start + segment["p_offset"]
    except (OSError, ELFError):
        return {}
    return found


def executable_path(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
