"""Records → Events, the same Events the other engines produce for the same probes.

An entry record becomes one event per entry probe of its site (ip = the function's address)
and, for the user-space function tracer, a `function` event (ip and the caller's return
address, printed `func <-caller` like the kernel's function tracer). A return record becomes
one event per return probe (ip = the function, ret_ip = the real return address). Timestamps
are CLOCK_MONOTONIC from the recorded TSC; cpu is the recorded TSC_AUX's cpu; comm is read
from /proc and kept per thread for 100 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from probescope.engines.fentry.image import Family
from probescope.engines.ptrace import procfs
from probescope.events import Event

# What Linux 6.18 records in common_flags / common_preempt_count for a uprobe hit (the trace
# line shows "DBZff"); the function tracer's lines show "....." (0, 0).
UPROBE_FLAGS = 0xFF
UPROBE_PREEMPT_COUNT = 0xFF
_RETURN = 0x80000000
_NUMBER = 0x00FFFFFF
_COMM_AGE = 0.1


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


class Decoder:
    """Turns one family's records into Events, counting hits per `group/event`."""

    def __init__(self, comms: Comms, hits: dict[str, int]) -> None:
        self.comms = comms
        self.hits = hits
        self.unknown_sites = 0

    def decode(
        self,
        family: Family,
        records: list[tuple[int, ...]],
        to_ns: Callable[[int], int],
        saw_pid: Callable[[int], None],
        known_pids: set[int],
    ) -> list[Event]:
        out: list[Event] = []
        append = out.append
        sites = family.sites
        hits = self.hits
        comm_of = self.comms.get
        for record in records:
            word = record[1]
            number = word & _NUMBER
            if number >= len(sites):
                self.unknown_sites += 1
                continue
            info = sites[number]
            group = info.group
            if group is None:
                continue
            tid = record[2]
            pid = record[3]
            if pid not in known_pids:
                saw_pid(pid)
                known_pids.add(pid)
            timestamp = to_ns(record[4])
            cpu = record[5] & 0xFFF
            comm = comm_of(tid, pid)

            def comm_getter(tid: int = tid, pid: int = pid) -> str:
                return comm_of(tid, pid)

            ip = info.function_address
            if word & _RETURN:
                ret_ip = record[7]
                for use in group.returns:
                    args: tuple[Any, ...] = use.evaluate(record, ret_ip, comm_getter)
                    hits[use.key] = hits.get(use.key, 0) + 1
                    append(
                        Event(timestamp, cpu, pid, tid, comm, use.event_type, ip, ret_ip, args,
                              UPROBE_FLAGS, UPROBE_PREEMPT_COUNT)
                    )  # fmt: skip
                continue
            for use in group.entries:
                args = use.evaluate(record, ip, comm_getter)
                hits[use.key] = hits.get(use.key, 0) + 1
                append(
                    Event(timestamp, cpu, pid, tid, comm, use.event_type, ip, None, args,
                          UPROBE_FLAGS, UPROBE_PREEMPT_COUNT)
                )  # fmt: skip
            for use in group.calls:
                hits[use.key] = hits.get(use.key, 0) + 1
                append(
                    Event(timestamp, cpu, pid, tid, comm, use.event_type, ip, None,
                          (ip, record[16]), 0, 0)
                )  # fmt: skip
        return out
