"""User-space addresses of a recording named from the recording alone: the traced processes'
mappings at the moment of the address (its facts' maps over time) and the functions of each
mapped file (kept in the file when user stacks were recorded) — no binaries needed.

`RecordedSymbols` names an address as `report` prints it; `RecordedFrames` is the aggregations'
`Symbolizer` over the same facts, giving the frames a live run gives (kernel frames from the
recording's kallsyms)."""

from __future__ import annotations

from bisect import bisect_right

from probescope.aggregate.symbolize import UNKNOWN_MODULE, KernelSymbolTable, Symbolizer
from probescope.aggregate.values import Frame
from probescope.record.facts import RecordingFacts

Mappings = tuple[tuple[int, int, int, str], ...]


class RecordedSymbols:
    """`symbols(pid, address, timestamp_ns)` → `function` or `function+0xoff`, None when the
    recording cannot tell."""

    def __init__(self, facts: RecordingFacts) -> None:
        self._maps: dict[int, list[tuple[int, Mappings]]] = {}
        for snapshot in sorted(facts.processes, key=lambda p: p.timestamp_ns):
            self._maps.setdefault(snapshot.pid, []).append((snapshot.timestamp_ns, snapshot.maps))
        self._functions: dict[str, tuple[list[int], list[tuple[int, int, str]]]] = {}
        for mapped in facts.files:
            functions = sorted(mapped.functions)
            self._functions[mapped.path] = ([f[0] for f in functions], functions)

    def __call__(self, pid: int, address: int, timestamp_ns: int) -> str | None:
        snapshots = self._maps.get(pid)
        if not snapshots:
            return None
        index = max(bisect_right([s[0] for s in snapshots], timestamp_ns) - 1, 0)
        for start, end, offset, path in snapshots[index][1]:
            if start <= address < end:
                found = self.function(path, address - start + offset)
                if found is None:
                    return None
                name, within = found
                return f"{name}+0x{within:x}" if within else name
        return None

    def mapping(self, pid: int, address: int) -> tuple[int, str] | None:
        """(file offset, path) of `address` in `pid`'s mappings, the newest snapshot first
        (as a live run looks up the maps it read last)."""
        for _, maps in reversed(self._maps.get(pid, ())):
            for start, end, offset, path in maps:
                if start <= address < end:
                    return address - start + offset, path
        return None

    def knows(self, path: str) -> bool:
        """Whether the recording holds the functions of `path`."""
        return path in self._functions

    def function(self, path: str, file_offset: int) -> tuple[str, int] | None:
        """(function name, offset inside it) of a file offset of `path`, None when unknown."""
        table = self._functions.get(path)
        if table is None:
            return None
        starts, functions = table
        index = bisect_right(starts, file_offset) - 1
        if index < 0:
            return None
        start, size, name = functions[index]
        within = file_offset - start
        if size and within >= size:
            return None
        return name, within


class RecordedFrames(Symbolizer):
    """Frames of a recording's user and kernel addresses: a live `Symbolizer`'s frames
    (function, offset, the mapped path), read from the recording's facts and kallsyms."""

    def __init__(self, facts: RecordingFacts, kernel: KernelSymbolTable | None = None) -> None:
        super().__init__(kernel=kernel)
        self.recorded = RecordedSymbols(facts)

    def _user_frame(self, pid: int, pc: int, *, exact: bool) -> Frame:
        # As the live symbolizer: a return address is looked up at its call (pc - 1).
        probe = pc if exact else pc - 1
        found = self.recorded.mapping(pid, probe)
        if found is None:
            self.unresolved += 1
            return Frame(f"0x{pc:x}", 0, UNKNOWN_MODULE)
        file_offset, path = found
        function = self.recorded.function(path, file_offset)
        if function is None:
            if not self.recorded.knows(path):
                self.unresolved += 1
            return Frame(f"0x{file_offset + (pc - probe):x}", 0, path)
        name, within = function
        return Frame(name, within + (pc - probe), path)
