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

import time
from collections.abc import Callable
from typing import Any

from probescope.engines.fentry.image import Family, SiteInfo
from probescope.events import Event
from probescope.system import procfs

# What Linux 6.18 records in common_flags / common_preempt_count for a uprobe hit (the trace
# line shows "DBZff"); the function tracer's lines show "....." (0, 0).
UPROBE_FLAGS = 0xFF
UPROBE_PREEMPT_COUNT = 0xFF
_RETURN = 0x80000000
_NUMBER = 0x00FFFFFF
_COMM_AGE = 0.1

Handler = Callable[[tuple[int, ...], Callable[[Event], None], int, int, str], None]


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


def site_handler(info: SiteInfo) -> Handler | None:
    """The function that turns one record of this site into its events (None: a site with
    no probes, only one of the engine's hooks)."""
    group = info.group
    if group is None or not (group.entries or group.returns or group.calls):
        return None
    namespace: dict[str, Any] = {"new": tuple.__new__, "Event": Event, "FN": info.function_address}
    lines = ["def handle(r, append, ts, cpu, comm):", "    pid = r[3]", "    tid = r[2]"]
    lines.append(f"    if r[1] & {_RETURN:#x}:")
    if group.returns:
        lines.append("        ip = r[7]")
        for index, use in enumerate(group.returns):
            namespace[f"R{index}"] = use.event_type
            lines.append(
                f"        append(new(Event, (ts, cpu, pid, tid, comm, R{index}, FN, ip, "
                f"{use.source}, {UPROBE_FLAGS}, {UPROBE_PREEMPT_COUNT})))"
            )
    lines.append("        return")
    lines.append("    ip = FN")
    for index, use in enumerate(group.entries):
        namespace[f"E{index}"] = use.event_type
        lines.append(
            f"    append(new(Event, (ts, cpu, pid, tid, comm, E{index}, FN, None, "
            f"{use.source}, {UPROBE_FLAGS}, {UPROBE_PREEMPT_COUNT})))"
        )
    for index, use in enumerate(group.calls):
        namespace[f"C{index}"] = use.event_type
        lines.append(
            f"    append(new(Event, (ts, cpu, pid, tid, comm, C{index}, FN, None, "
            f"{use.source}, 0, 0)))"
        )
    filename = f"<probescope fentry site {info.number} {group.function}>"
    exec(compile("\n".join(lines) + "\n", filename, "exec"), namespace)
    handler: Handler = namespace["handle"]
    return handler


class Decoder:
    """Turns one family's records into Events."""

    def __init__(self, comms: Comms) -> None:
        self.comms = comms
        self.unknown_sites = 0
        self._handlers: dict[int, list[Handler | None]] = {}

    def decode(
        self,
        family: Family,
        records: list[tuple[int, ...]],
        clock: tuple[int, int, float],
        saw_pid: Callable[[int], None],
        known_pids: set[int],
        ignored_pids: set[int] = frozenset(),  # type: ignore[assignment]
    ) -> list[Event]:
        """The events of `records`; records of `ignored_pids` (fork children not followed,
        before their copy is restored) are dropped."""
        out: list[Event] = []
        append = out.append
        sites = family.sites
        handlers = self._handlers.setdefault(id(family), [])
        comm_of = self.comms.get
        comms: dict[int, str] = {}
        ns0, tsc0, rate = clock
        for record in records:
            number = record[1] & _NUMBER
            if number >= len(handlers):
                if number >= len(sites):
                    self.unknown_sites += 1
                    continue
                handlers.extend(site_handler(info) for info in sites[len(handlers) :])
            handler = handlers[number]
            if handler is None:
                continue
            if ignored_pids and record[3] in ignored_pids:
                continue
            tid = record[2]
            comm = comms.get(tid)
            if comm is None:
                pid = record[3]
                if pid not in known_pids:
                    saw_pid(pid)
                    known_pids.add(pid)
                comm = comms[tid] = comm_of(tid, pid)
            handler(record, append, ns0 + int((record[4] - tsc0) * rate), record[5] & 0xFFF, comm)
        return out
