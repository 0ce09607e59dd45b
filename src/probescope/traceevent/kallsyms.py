"""Kernel addresses as the kernel's `%pS`/`%ps`/`%pB` print them, from a `/proc/kallsyms` table.

The text sink uses it for kprobe and function-tracer lines and the `symbol` type; the print fmt
compiler for tracepoints. A table is read from a stream or a file it is given (the running
kernel's is read by whoever builds the session's `KernelContext`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from probescope.errors import RingBufferFormatError

_MASK64 = (1 << 64) - 1
_PRINTED_LIMIT = 65536


class KernelSymbols:
    """The kernel's symbol table as `/proc/kallsyms` lists it, for `sprint_symbol`'s text.

    Lookups follow kernel/kallsyms.c: an address inside the core kernel's text (or init text,
    or anywhere up to `_end` when the table holds data symbols, CONFIG_KALLSYMS_ALL) names the
    first symbol listed at the highest address not above it, its size running to the next
    higher address in the table or to the end of its section (`get_symbol_pos`). An address
    among a module's symbols (`[name]` entries: modules, BPF, ftrace trampolines) names its
    closest symbol with ` [module]` appended while a higher symbol of that module bounds it;
    past a module's last symbol the size is unknown here, and like any other address (user
    space, no symbol) it prints as `0x...`.
    """

    def __init__(self, stream: IO[str] | IO[bytes]) -> None:
        text = stream.read()
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        core: list[tuple[int, str, str]] = []
        modules: dict[str, list[tuple[int, str, str]]] = {}
        specials: dict[str, int] = {}
        data_symbols = 0
        for line in text.splitlines():
            parts = line.split()
            if len(parts) not in (3, 4):
                continue
            try:
                address = int(parts[0], 16)
            except ValueError:
                continue
            kind, name = parts[1], parts[2]
            if len(parts) == 4:
                modules.setdefault(parts[3].strip("[]"), []).append((address, kind, name))
                continue
            core.append((address, kind, name))
            if name in _SECTION_MARKS:
                specials.setdefault(name, address)
            if kind in "dDbB":
                data_symbols += 1
        core.sort(key=lambda entry: entry[0])
        self.entries = core
        self.addresses = [address for address, _, _ in core]
        self.modules = {
            module: sorted(entries, key=lambda entry: entry[0])
            for module, entries in modules.items()
        }
        self.text_start = specials.get("_stext", 0)
        self.text_end = specials.get("_etext", 0)
        self.init_start = specials.get("_sinittext", 0)
        self.init_end = specials.get("_einittext", 0)
        self.kernel_end = specials.get("_end", 0)
        self.all_symbols = bool(self.kernel_end) and data_symbols > 1
        self._printed: dict[tuple[int, bool, bool], str] = {}
        if not any(self.addresses) or not self.text_end:
            raise RingBufferFormatError(
                "the kernel symbol table has no addresses",
                hint="read /proc/kallsyms as root (kptr_restrict hides addresses otherwise)",
            )

    @classmethod
    def from_path(cls, path: str | Path) -> KernelSymbols:
        """The table of a kallsyms file (`/proc/kallsyms` read as root, or a copy)."""
        with open(path, "rb") as stream:
            return cls(stream)

    def _is_kernel(self, address: int) -> bool:
        if self.all_symbols:
            return self.text_start <= address <= self.kernel_end
        return (
            self.text_start <= address < self.text_end or self.init_start <= address < self.init_end
        )

    def _core_index(self, address: int) -> int | None:
        index = bisect.bisect_right(self.addresses, address) - 1
        if index < 0:
            return None
        start = self.addresses[index]
        while index and self.addresses[index - 1] == start:
            index -= 1
        return index

    def lookup(self, address: int) -> tuple[str, int, int, str | None] | None:
        """(name, offset, size, module) of the symbol holding `address`, or None."""
        if self._is_kernel(address):
            index = self._core_index(address)
            if index is None:
                return None
            start = self.addresses[index]
            after = bisect.bisect_right(self.addresses, start)
            if after < len(self.addresses):
                end = self.addresses[after]
            elif self.init_start <= address < self.init_end:
                end = self.init_end
            elif self.all_symbols:
                end = self.kernel_end
            else:
                end = self.text_end
            return self.entries[index][2], address - start, end - start, None
        for module, entries in self.modules.items():
            if not entries[0][0] <= address < entries[-1][0]:
                continue
            starts = [entry[0] for entry in entries]
            index = bisect.bisect_right(starts, address) - 1
            start = starts[index]
            while index and starts[index - 1] == start:
                index -= 1
            end = starts[bisect.bisect_right(starts, start)]
            return entries[index][2], address - start, end - start, module
        return None

    def symbol(self, address: int, *, offset: bool = True, backtrace: bool = False) -> str:
        """`sprint_symbol` (`%pS`), `sprint_symbol_no_offset` (`%ps`) or `sprint_backtrace`
        (`%pB`, which names the call before a return address) for a 64-bit address. Kept per
        address: function-tracer lines name the same few functions over and over."""
        key = (address, offset, backtrace)
        text = self._printed.get(key)
        if text is None:
            text = self._symbol(address, offset, backtrace)
            if len(self._printed) < _PRINTED_LIMIT:
                self._printed[key] = text
        return text

    def _symbol(self, address: int, offset: bool, backtrace: bool) -> str:
        shift = 1 if backtrace else 0
        found = self.lookup((address - shift) & _MASK64)
        if found is None:
            return f"0x{address:x}"
        name, within, size, module = found
        text = f"{name}+{within + shift:#x}/{size:#x}" if offset else name
        return f"{text} [{module}]" if module else text

    def subset(self, addresses: Iterable[int]) -> str:
        """`/proc/kallsyms` lines that give the same answers for `addresses` (for fixtures;
        core kernel symbols only)."""
        keep = {i for i, entry in enumerate(self.entries) if entry[2] in _SECTION_MARKS}
        for address in addresses:
            for probe in (address, (address - 1) & _MASK64):
                if not self._is_kernel(probe):
                    continue
                index = self._core_index(probe)
                if index is None:
                    continue
                keep.add(index)
                after = bisect.bisect_right(self.addresses, self.addresses[index])
                if after < len(self.addresses):
                    keep.add(after)
        return "".join(
            f"{self.entries[i][0]:016x} {self.entries[i][1]} {self.entries[i][2]}\n"
            for i in sorted(keep)
        )


_SECTION_MARKS = ("_stext", "_etext", "_sinittext", "_einittext", "_end")
