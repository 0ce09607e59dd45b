"""What an offline report needs of the traced processes, sampled while they run: the names and
thread groups of their threads, their executable mappings each time those change (stamped on
the trace clock, so a viewer resolves an address with the maps of its moment), and the
build-id and functions of each file mapped — so user stacks resolve on another machine with
no binaries."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence

from probescope.aggregate.maps_keeper import MapsKeeper
from probescope.errors import ProbescopeError
from probescope.record.facts import MappedFile, ProcessMaps
from probescope.symbols.maps import mapped_file
from probescope.symbols.table import SymbolTable
from probescope.system.maps import Mapping, parse_maps, read_maps
from probescope.system.procfs import descendant_processes, read_comm, thread_ids

CLOCKS: dict[str, int] = {"mono": time.CLOCK_MONOTONIC, "boot": time.CLOCK_BOOTTIME}
"""Trace clocks a user-space clock reads exactly; others (`local`, `global`: the scheduler
clock) are close to CLOCK_MONOTONIC on x86 and are stamped with it."""


def trace_clock_reader(clock: str) -> Callable[[], int]:
    """A reader of the clock the kernel stamps events with, in nanoseconds."""
    clock_id = CLOCKS.get(clock, time.CLOCK_MONOTONIC)
    return lambda: time.clock_gettime_ns(clock_id)


class ProcessWatcher:
    """Samples the processes of `pids` (and their children, with `follow_children`) at most
    every `interval` seconds when `poll()` is called, and once more at `final()`.

    `comms` and `tgids` name every thread seen; `maps` lists executable mappings as they
    changed; `files()` describes every file mapped (`with_functions`: its function symbols too,
    for user stacks)."""

    def __init__(
        self,
        pids: Sequence[int],
        *,
        follow_children: bool = True,
        clock: str = "mono",
        interval: float = 0.1,
    ) -> None:
        self.roots = list(pids)
        self.follow_children = follow_children
        self.interval = interval
        self.now = trace_clock_reader(clock)
        self.comms: dict[int, str] = {}
        self.tgids: dict[int, int] = {}
        self.maps: list[ProcessMaps] = []
        self._last_maps: dict[int, tuple[tuple[int, int, int, str], ...]] = {}
        self._open_paths: dict[str, str] = {}
        self._sampled_at = 0.0
        self._keeper: MapsKeeper | None = None
        self._lock = threading.Lock()  # the keeper's reader thread adds maps too

    def add(self, pid: int) -> None:
        if pid not in self.roots:
            self.roots.append(pid)

    def poll(self) -> None:
        now = time.monotonic()
        if now - self._sampled_at >= self.interval:
            self._sampled_at = now
            self.sample()

    def final(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        self.sample()

    def sample(self) -> None:
        processes = list(self.roots)
        if self.follow_children:
            for pid in self.roots:
                with contextlib.suppress(ProbescopeError, OSError):
                    processes += descendant_processes(pid)
        for pid in dict.fromkeys(processes):
            with contextlib.suppress(ProbescopeError, OSError):
                self._sample_process(pid)

    def _sample_process(self, pid: int) -> None:
        comm = read_comm(pid)
        for tid in thread_ids(pid):
            with contextlib.suppress(ProbescopeError, OSError):
                self.comms[tid] = read_comm(tid)
                self.tgids[tid] = pid
        stamp = self.now()
        with self._lock:
            self._add_maps(pid, stamp, comm, read_maps(pid))

    def add_maps_text(self, pid: int, text: str) -> None:
        """Maps another process copied (the maps keeper, as a process exec'd or exited: a
        short command is gone before the next sample, and with it its maps)."""
        stamp = self.now()
        with self._lock:
            comm = self.comms.get(pid)
            if comm is None:
                with contextlib.suppress(ProbescopeError, OSError):
                    comm = self.comms[pid] = read_comm(pid)
                    self.tgids[pid] = pid
            self._add_maps(pid, stamp, comm or "", parse_maps(text))

    def keep_maps_with(self, keeper: MapsKeeper) -> None:
        """Let `keeper` feed maps until `final()`, which ends it first (its last copies, at the
        traced processes' exits, are read before the file is written)."""
        self._keeper = keeper

    def _add_maps(self, pid: int, stamp: int, comm: str, mappings: list[Mapping]) -> None:
        executable = tuple(
            (m.start, m.end, m.offset, m.path)
            for m in mappings
            if m.executable and m.path is not None
        )
        if executable and self._last_maps.get(pid) != executable:
            self._last_maps[pid] = executable
            self.maps.append(ProcessMaps(pid, stamp, comm, executable))
            for mapping in mappings:
                if mapping.executable and mapping.is_file and mapping.path not in self._open_paths:
                    self._remember_path(pid, mapping)

    def _remember_path(self, pid: int, mapping: Mapping) -> None:
        assert mapping.path is not None
        with contextlib.suppress(ProbescopeError, OSError):
            try:
                opened = mapped_file(pid, mapping)
            except ProbescopeError:  # the process is gone: its path, if it is the same file
                opened = mapped_file(pid, mapping, root="")
            if opened:
                self._open_paths[mapping.path] = opened

    def files(self, *, with_functions: bool) -> list[MappedFile]:
        """Every file mapped executable: build-id and, `with_functions`, its functions as
        (file offset, size, name)."""
        described = []
        for path, opened in sorted(self._open_paths.items()):
            try:
                table = SymbolTable.for_path(opened)
            except (ProbescopeError, OSError):
                described.append(MappedFile(path))
                continue
            functions: tuple[tuple[int, int, str], ...] = ()
            if with_functions:
                functions = tuple(
                    (f.offset, f.size, f.name)
                    for f in table.functions  # as live stacks name them
                )
            described.append(MappedFile(path, table.build_id, functions))
        return described
