"""User-space addresses of a recording named from the recording alone: the traced processes'
mappings at the moment of the address (its facts' maps over time) and the functions of each
mapped file (kept in the file when user stacks were recorded) — no binaries needed."""

from __future__ import annotations

from bisect import bisect_right

from probescope.record.facts import RecordingFacts


class RecordedSymbols:
    """`symbols(pid, address, timestamp_ns)` → `function` or `function+0xoff`, None when the
    recording cannot tell."""

    def __init__(self, facts: RecordingFacts) -> None:
        self._maps: dict[int, list[tuple[int, tuple[tuple[int, int, int, str], ...]]]] = {}
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
                return self._function(path, address - start + offset)
        return None

    def _function(self, path: str, file_offset: int) -> str | None:
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
        return f"{name}+0x{within:x}" if within else name
