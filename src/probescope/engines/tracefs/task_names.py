"""Names and thread groups of the tasks a live session's records come from.

Ring-buffer records carry only the thread id. The kernel's own printer names a task from
`saved_cmdlines` (and, with record-tgid, `saved_tgids`), which it fills at each CPU's next
context switch — after the records, and sometimes still holding an earlier task of the same
pid. So a task seen for the first time is looked up in /proc first, then there; renames (exec,
prctl) are followed by reading `saved_cmdlines` again now and then; and the command's own
process is named from /proc while it is a zombie, before it is reaped.
"""

from __future__ import annotations

import contextlib
import operator
import time

from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import TracefsError
from probescope.events import Event, EventBatch
from probescope.system.procfs import status_fields
from probescope.traceevent.decoder import UNKNOWN_COMM, EventDecoder
from probescope.traceevent.format import parse_saved_cmdlines, parse_saved_tgids

COMM_REFRESH_SECONDS = 0.05
_TID = operator.itemgetter(Event._fields.index("tid"))


class TaskNames:
    """Keeps a decoder's task names and tgids up to date while a session streams."""

    def __init__(self, tracefs: Tracefs, decoder: EventDecoder) -> None:
        self.tracefs = tracefs
        self.decoder = decoder
        self._checked: set[int] = set()
        self._pinned: dict[int, str] = {}
        self._comms_read_at = 0.0

    def refresh(self) -> None:
        """Follow renames (exec, prctl) the way the kernel's own printer does: saved_cmdlines,
        read again at most every COMM_REFRESH_SECONDS, names the tasks of the next records."""
        now = time.monotonic()
        if now - self._comms_read_at < COMM_REFRESH_SECONDS:
            return
        self._comms_read_at = now
        with contextlib.suppress(TracefsError):
            self.decoder.update_comms(parse_saved_cmdlines(self.tracefs.read("saved_cmdlines")))
            self.decoder.update_comms(self._pinned)

    def name_new_tasks(self, batch: EventBatch) -> None:
        """Name the tasks `batch` is the first to show (its events are renamed in place): from
        /proc while they live, else from saved_cmdlines and saved_tgids."""
        fresh = set(map(_TID, batch.events)) - self._checked
        if not fresh:
            return
        saved_comms = parse_saved_cmdlines(self.tracefs.read("saved_cmdlines"))
        saved_tgids = parse_saved_tgids(self.tracefs.read("saved_tgids"))
        comms: dict[int, str] = {}
        tgids: dict[int, int] = {}
        for tid in fresh:
            self._checked.add(tid)
            # A live task's own name first: saved_cmdlines may still hold the name of an
            # earlier task with the same pid, and the kernel's `trace` prints the latest name.
            comm, tgid = task_of(tid)
            comm = comm or saved_comms.get(tid)
            tgid = tgid or saved_tgids.get(tid)
            if comm is not None:
                comms[tid] = comm
            if tgid is not None:
                tgids[tid] = tgid
        comms.update((tid, self._pinned[tid]) for tid in fresh & self._pinned.keys())
        self.decoder.update_comms(comms)
        self.decoder.update_tgids(tgids)
        batch.events[:] = [
            e._replace(
                pid=tgids.get(e.tid, e.pid),
                comm=comms.get(e.tid, e.comm),
            )
            if e.tid in fresh
            else e
            for e in batch.events
        ]

    def task(self, tid: int) -> tuple[str, int]:
        """(comm, tgid) of one thread as events name it — for readers of raw records that
        name each thread once: /proc first, then saved_cmdlines and saved_tgids."""
        comm, tgid = task_of(tid)
        comm = self._pinned.get(tid, comm)
        if comm is None or tgid is None:
            with contextlib.suppress(TracefsError):
                if comm is None:
                    comm = parse_saved_cmdlines(self.tracefs.read("saved_cmdlines")).get(tid)
                if tgid is None:
                    tgid = parse_saved_tgids(self.tracefs.read("saved_tgids")).get(tid)
        return comm or UNKNOWN_COMM, tgid or tid

    def pin(self, pid: int) -> None:
        """Name the command's process from /proc while it is a zombie, before reaping it: the
        decoder may still be behind on its records, and saved_cmdlines may not have it (the
        kernel saves a name at the task's next context switch, if ever) or may hold the name
        of an earlier process with the same pid."""
        comm, tgid = task_of(pid)
        if comm is not None:
            self._pinned[pid] = comm
            self.decoder.update_comms({pid: comm})
            if tgid is not None:
                self.decoder.update_tgids({pid: tgid})


def task_of(tid: int) -> tuple[str | None, int | None]:
    """(comm, tgid) of a live thread from /proc, Nones when it is gone."""
    status = status_fields(tid)
    tgid = status.get("Tgid")
    return status.get("Name"), int(tgid) if tgid else None
