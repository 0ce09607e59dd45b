"""Kernel addresses as the kernel's `%pS`/`%ps` print them, from /proc/kallsyms.

`%pS` is `name+0xoff/0xsize [module]`, where size runs to the next symbol's address (the
kernel's kallsyms_lookup_size_offset); `%ps` is the bare name. Unknown addresses print as
`0x...` like the kernel does.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSymbol:
    name: str
    address: int
    size: int
    module: str | None


class Kallsyms:
    """Symbols by address; sizes run to the next symbol of the same object (the kernel
    proper or one module), as kallsyms_lookup_size_offset and module_address_lookup do."""

    def __init__(self, text: str) -> None:
        by_object: dict[str | None, list[tuple[int, str]]] = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            address = int(parts[0], 16)
            if address == 0:
                continue
            module = parts[3].strip("[]") if len(parts) > 3 else None
            by_object.setdefault(module, []).append((address, parts[2]))
        self._symbols: list[tuple[int, str, str | None, int]] = []
        for module, entries in by_object.items():
            entries.sort()
            for index, (address, name) in enumerate(entries):
                following = index + 1
                while following < len(entries) and entries[following][0] == address:
                    following += 1
                if following < len(entries):
                    size = entries[following][0] - address
                    self._symbols.append((address, name, module, size))
        self._symbols.sort()
        self._addresses = [symbol[0] for symbol in self._symbols]

    def __bool__(self) -> bool:
        return bool(self._symbols)

    def lookup(self, address: int) -> tuple[KernelSymbol, int] | None:
        """(symbol, offset into it) or None outside every known symbol."""
        index = bisect.bisect_right(self._addresses, address) - 1
        while index >= 0:
            start, name, module, size = self._symbols[index]
            if address < start + size:
                return KernelSymbol(name, start, size, module), address - start
            if index and self._symbols[index - 1][0] == start:
                index -= 1
                continue
            return None
        return None

    @classmethod
    def load(cls) -> Kallsyms:
        """The running kernel's symbols (read once), or the table given to `use()`."""
        return _override[0] if _override else _running_kernel()

    @staticmethod
    def use(table: Kallsyms | None) -> None:
        """Print with `table` instead of /proc/kallsyms (None: back to the running kernel)."""
        _override.clear()
        if table is not None:
            _override.append(table)

    def print_symbol_offset(self, address: int) -> str:
        """`%pS`: `name+0xoff/0xsize` (with ` [module]` for module symbols)."""
        found = self.lookup(address)
        if found is None:
            return f"0x{address:x}"
        symbol, offset = found
        text = f"{symbol.name}+0x{offset:x}/0x{symbol.size:x}"
        return f"{text} [{symbol.module}]" if symbol.module else text

    def print_symbol(self, address: int) -> str:
        """`%ps`: the symbol name (with ` [module]`), or the address."""
        found = self.lookup(address)
        if found is None:
            return f"0x{address:x}"
        symbol, _ = found
        return f"{symbol.name} [{symbol.module}]" if symbol.module else symbol.name


_override: list[Kallsyms] = []


@functools.cache
def _running_kernel() -> Kallsyms:
    try:
        with open("/proc/kallsyms") as file:
            return Kallsyms(file.read())
    except OSError:
        return Kallsyms("")
