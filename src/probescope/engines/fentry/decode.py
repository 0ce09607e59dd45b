"""Records → Events, the same Events the other engines produce for the same probes.

An entry record becomes one event per entry probe of its site (ip = the function's address)
and, for the user-space function tracer, a `function` event (ip and the caller's return
address, printed `func <-caller` like the kernel's function tracer). A return record becomes
one event per return probe (ip = the function, ret_ip = the real return address, which is also
what `%ip` reads there). Timestamps are CLOCK_MONOTONIC from the recorded TSC; cpu is the
recorded TSC_AUX's cpu; comm is read from /proc and kept per thread for 100 ms.

Each site gets one generated function (like the text sink's line printers) that builds all of
its events from a record with the argument expressions inlined: the drain's cost per event is a
few tuple operations, not a call per argument.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable
from typing import Any

from probescope.engines.fentry.image import Family, SiteInfo
from probescope.engines.fentry.ring import compact_layout
from probescope.events import Event
from probescope.system import procfs

# What Linux 6.18 records in common_flags / common_preempt_count for a uprobe hit (the trace
# line shows "DBZff"); the function tracer's lines show "....." (0, 0).
UPROBE_FLAGS = 0xFF
UPROBE_PREEMPT_COUNT = 0xFF
_RETURN = 0x80000000
_NUMBER = 0x00FFFFFF
_COMM_AGE = 0.1

Handler = Callable[
    [list[tuple[int, ...]], Callable[[list[Event]], None], int, int, float, dict[int, str]], None
]


class Comms:
    """comm per thread id, from /proc, re-read when older than 100 ms; a thread that is gone
    keeps the last name seen, or its process's name from when it was set up."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[str, float]] = {}
        self._processes: dict[int, str] = {}

    def remember_process(self, pid: int) -> None:
        comm = procfs.read_comm(pid)
        if comm != "<...>":
            self._processes[pid] = comm

    def get(self, tid: int, pid: int = 0) -> str:
        now = time.monotonic()
        known = self._known.get(tid)
        if known is not None and now - known[1] < _COMM_AGE:
            return known[0]
        comm = procfs.read_comm(tid)
        if comm == "<...>":
            comm = known[0] if known is not None else self._processes.get(pid, comm)
        self._known[tid] = (comm, now)
        return comm


_FIELD = re.compile(r"\br\[(\d+)\]")
ALWAYS_READ = frozenset({1, 2, 3, 4, 5, 7})  # site, tid, pid, tsc, cpu, return address


def fields_read(info: SiteInfo) -> set[int]:
    """The record fields this site's events read."""
    group = info.group
    if group is None:
        return set()
    uses = [*group.entries, *group.returns, *group.calls]
    return {int(m) for use in uses for m in _FIELD.findall(use.source)}


def site_handler(info: SiteInfo, where: dict[int, int]) -> Handler | None:
    """The function that turns the records of this site (a list, unpacked so that field i of
    RECORD sits at `where[i]`) into their events (None: a site with no probes, only one of the
    engine's hooks)."""
    group = info.group
    if group is None or not (group.entries or group.returns or group.calls):
        return None
    namespace: dict[str, Any] = {"new": tuple.__new__, "Event": Event, "FN": info.function_address}
    head = "new(Event, (ns0 + int((r[4] - tsc0) * rate), r[5] & 4095, r[3], r[2], comms[r[2]], "
    lines = ["def handle(rs, extend, ns0, tsc0, rate, comms):"]
    if group.returns:
        lines.append(f"    returns = [r for r in rs if r[1] & {_RETURN:#x}]")
        lines.append(f"    entries = [r for r in rs if not r[1] & {_RETURN:#x}]")
    else:
        lines.append("    entries = rs")
    for index, use in enumerate(group.returns):
        namespace[f"R{index}"] = use.event_type
        lines.append(
            f"    extend([{head}R{index}, FN, r[7], {use.source}, {UPROBE_FLAGS}, "
            f"{UPROBE_PREEMPT_COUNT})) for r in returns])"
        )
    for index, use in enumerate(group.entries):
        namespace[f"E{index}"] = use.event_type
        lines.append(
            f"    extend([{head}E{index}, FN, None, {use.source}, {UPROBE_FLAGS}, "
            f"{UPROBE_PREEMPT_COUNT})) for r in entries])"
        )
    for index, use in enumerate(group.calls):
        namespace[f"C{index}"] = use.event_type
        lines.append(
            f"    extend([{head}C{index}, FN, None, {use.source}, 0, 0)) for r in entries])"
        )
    filename = f"<probescope fentry site {info.number} {group.function}>"
    source = _FIELD.sub(lambda m: f"r[{where[int(m.group(1))]}]", "\n".join(lines) + "\n")
    exec(compile(source, filename, "exec"), namespace)
    handler: Handler = namespace["handle"]
    return handler


class Decoder:
    """Turns one family's records into Events."""

    def __init__(self, comms: Comms) -> None:
        self.comms = comms
        self.unknown_sites = 0
        self._handlers: dict[int, list[Handler | None]] = {}
        self._layouts: dict[int, tuple[int, set[int], struct.Struct, dict[int, int]]] = {}

    def layout(self, family: Family) -> struct.Struct:
        """The unpacking of this family's records: only the fields its sites read (redone,
        handlers with it, when sites were added)."""
        known = self._layouts.get(id(family))
        if known is not None and known[0] == len(family.sites):
            return known[2]
        needed = set(ALWAYS_READ)
        for info in family.sites:
            needed |= fields_read(info)
        if known is not None and needed == known[1]:
            self._layouts[id(family)] = (len(family.sites), needed, known[2], known[3])
            return known[2]
        layout, where = compact_layout(needed)
        self._layouts[id(family)] = (len(family.sites), needed, layout, where)
        self._handlers[id(family)] = []  # compiled against the old layout
        return layout

    def decode(
        self,
        family: Family,
        records: list[tuple[int, ...]],
        clock: tuple[int, int, float],
        saw_pid: Callable[[int], None],
        known_pids: set[int],
        ignored_pids: set[int] = frozenset(),  # type: ignore[assignment]
    ) -> list[Event]:
        """The events of `records` (read with layout(family); not in time order across
        sites); records of `ignored_pids` (fork children not followed, before their copy is
        restored) are dropped."""
        where = self._layouts[id(family)][3]
        site_at, tid_at, pid_at = where[1], where[2], where[3]
        if ignored_pids:
            records = [r for r in records if r[pid_at] not in ignored_pids]
        threads = {r[tid_at]: r[pid_at] for r in records}
        for pid in set(threads.values()) - known_pids:
            saw_pid(pid)
            known_pids.add(pid)
        comm_of = self.comms.get
        comms = {tid: comm_of(tid, pid) for tid, pid in threads.items()}
        sites = family.sites
        handlers = self._handlers.setdefault(id(family), [])
        words = {r[site_at] & _NUMBER for r in records}
        if words and max(words) >= len(handlers):
            handlers.extend(site_handler(info, where) for info in sites[len(handlers) :])
        out: list[Event] = []
        extend = out.extend
        ns0, tsc0, rate = clock
        if len(words) == 1:
            parts = {words.pop(): records}
        else:
            parts = {}
            for record in records:
                number = record[site_at] & _NUMBER
                part = parts.get(number)
                if part is None:
                    part = parts[number] = []
                part.append(record)
        for number, part in parts.items():
            if number >= len(handlers):
                self.unknown_sites += len(part)
                continue
            handler = handlers[number]
            if handler is not None:
                handler(part, extend, ns0, tsc0, rate, comms)
        return out
