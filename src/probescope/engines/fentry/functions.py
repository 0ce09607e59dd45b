"""The user-space function tracer's text: `func_2 <-main`, as the kernel's function tracer
prints its lines (`trace_fn_trace`: function and caller as %ps, no offsets), with the traced
program's own symbols.

The text sink asks an event type's `format` for `call_text(event)` (sinks/text.py
function_printer); this object answers from the process's memory map (read when the process is
first seen, and again when an address falls outside every known mapping, after a dlopen) and
the symbol tables of the mapped files. Unknown addresses print as hex, as the kernel does.
"""

from __future__ import annotations

import os

from probescope.errors import ProbescopeError
from probescope.events import Event
from probescope.symbols.table import SymbolTable
from probescope.system.maps import Mapping, read_maps

_MAX_CACHE = 1 << 16


class UserCallText:
    """`func <-caller` for user-space function events, symbolized per process."""

    def __init__(self) -> None:
        self._maps: dict[int, list[Mapping]] = {}
        self._names: dict[tuple[int, int], str] = {}

    def call_text(self, event: Event) -> str:
        ip, parent = event.args[0], event.args[1]
        text = self.symbol(event.pid, ip)
        if parent:
            text += " <-" + self.symbol(event.pid, parent)
        return text

    def remember(self, pid: int) -> None:
        """Read the process's memory map now (while it lives)."""
        try:
            fresh = read_maps(pid)
        except OSError:
            return
        if fresh:  # a process that exited shows an empty map: keep what we knew
            self._maps[pid] = fresh

    def symbol(self, pid: int, address: int) -> str:
        key = (pid, address)
        name = self._names.get(key)
        if name is None:
            name = self._lookup(pid, address)
            if len(self._names) < _MAX_CACHE:
                self._names[key] = name
        return name

    def _lookup(self, pid: int, address: int) -> str:
        mapping = self._mapping(pid, address)
        if mapping is None:
            self.remember(pid)
            mapping = self._mapping(pid, address)
        if mapping is None or mapping.path is None or not mapping.path.startswith("/"):
            return f"0x{address:x}"
        path = mapping.path
        rooted = f"/proc/{pid}/root{path}"
        if not os.path.exists(path) and os.path.exists(rooted):
            path = rooted
        try:
            function = SymbolTable.for_path(path).function_at_offset(
                mapping.offset + address - mapping.start
            )
        except ProbescopeError:
            function = None
        return f"0x{address:x}" if function is None else function.name

    def _mapping(self, pid: int, address: int) -> Mapping | None:
        for mapping in self._maps.get(pid, ()):
            if mapping.start <= address < mapping.end:
                return mapping
        return None
