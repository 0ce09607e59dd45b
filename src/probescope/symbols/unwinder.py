"""Where exception unwinding starts and where it is caught: the unwinder's entry points in a file.

A C++ `throw` enters libgcc's unwinder (`_Unwind_RaiseException`; `_Unwind_Resume` between
cleanup frames, `_Unwind_ForcedUnwind` for thread cancellation) and a handler that catches it
calls `__cxa_begin_catch`. They live in libgcc_s, libstdc++, libc++abi or libunwind, or in the
executable itself when those are linked statically. An engine that rewrites return addresses
must watch both ends (engines/ptrace/returns.py says why).
"""

from __future__ import annotations

import os
from typing import Final

from probescope.errors import SymbolError
from probescope.symbols.table import SymbolTable

UNWIND: Final = "unwind"  # unwinding starts (or resumes)
CATCH: Final = "catch"  # a handler caught the exception

ENTRY_POINTS: Final = {
    "_Unwind_RaiseException": UNWIND,
    "_Unwind_Resume": UNWIND,
    "_Unwind_Resume_or_Rethrow": UNWIND,
    "_Unwind_ForcedUnwind": UNWIND,
    "__cxa_begin_catch": CATCH,
}
_LIBRARY_PREFIXES = ("libgcc_s", "libstdc++", "libc++abi", "libunwind")


def may_hold_unwinder(path: str, is_main_executable: bool) -> bool:
    """Only the unwinder libraries and the executable (static libgcc/libstdc++) can define
    the entry points: other files are not worth reading."""
    return is_main_executable or os.path.basename(path).startswith(_LIBRARY_PREFIXES)


def unwinder_entry_points(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """(UNWIND or CATCH, file offset) of every entry point the file defines, by name; empty
    when it defines none or is no binary a uprobe could go into."""
    try:
        table = SymbolTable.for_path(path)
    except SymbolError:
        return []
    found: list[tuple[str, int]] = []
    for name, role in sorted(ENTRY_POINTS.items()):
        for function in table.functions_named(name):
            found.append((role, function.offset))
    return found
