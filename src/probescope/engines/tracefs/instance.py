"""A private tracefs instance: its own ring buffer, event enables, pid filter and clock, so a
session never touches the global buffer or anyone else's tracing."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import TracefsError


@dataclass(frozen=True)
class CpuStats:
    """`per_cpu/cpuN/stats` of an instance; counters are cumulative since the buffer was reset."""

    entries: int = 0
    overrun: int = 0
    commit_overrun: int = 0
    dropped_events: int = 0
    read_events: int = 0

    @classmethod
    def parse(cls, text: str) -> CpuStats:
        values: dict[str, int] = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            value = value.strip()
            if value.isdigit():
                values[key.strip().replace(" ", "_")] = int(value)
        return cls(
            entries=values.get("entries", 0),
            overrun=values.get("overrun", 0),
            commit_overrun=values.get("commit_overrun", 0),
            dropped_events=values.get("dropped_events", 0),
            read_events=values.get("read_events", 0),
        )

    @property
    def lost(self) -> int:
        return self.overrun + self.commit_overrun + self.dropped_events


class Instance(Tracefs):
    """`instances/NAME` of a tracefs mount."""

    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root)
        self.name = name

    @classmethod
    def create(cls, tracefs: Tracefs, name: str) -> Instance:
        path = tracefs.root / "instances" / name
        try:
            os.mkdir(path)
        except FileExistsError:
            raise TracefsError(
                f"tracefs instance {name!r} already exists",
                hint="another session uses this name; run `probescope cleanup`",
            ) from None
        except OSError as error:
            raise TracefsError(
                f"cannot create tracefs instance {path}: {os.strerror(error.errno or 0)}"
            ) from None
        return cls(path, name)

    def remove(self, attempts: int = 50) -> None:
        """rmdir the instance (which also disables whatever is enabled in it). Retries while
        a reader still holds its buffer (EBUSY)."""
        for attempt in range(attempts):
            try:
                os.rmdir(self.root)
                return
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno != errno.EBUSY or attempt == attempts - 1:
                    raise TracefsError(
                        f"cannot remove tracefs instance {self.root}: "
                        f"{os.strerror(error.errno or 0)}"
                    ) from None
                time.sleep(0.02)

    def cpus(self) -> list[int]:
        return sorted(int(n[3:]) for n in self.list_dir("per_cpu") if n.startswith("cpu"))

    def event_path(self, group: str, event: str) -> str:
        return f"events/{group}/{event}"

    def enable_event(self, group: str, event: str, on: bool = True) -> None:
        self.write(f"{self.event_path(group, event)}/enable", "1" if on else "0")

    def enable_group(self, group: str, on: bool = True) -> None:
        self.write(f"events/{group}/enable", "1" if on else "0")

    def set_filter(self, group: str, event: str, expression: str) -> None:
        self.write(f"{self.event_path(group, event)}/filter", expression)

    def event_format(self, group: str, event: str) -> str:
        return self.read(f"{self.event_path(group, event)}/format")

    def set_option(self, option: str, on: bool) -> None:
        self.write(f"options/{option}", "1" if on else "0")

    def set_event_pids(self, pids: list[int], follow_fork: bool = True) -> None:
        """Record only these tasks (and, with event-fork, the children they create later)."""
        self.set_option("event-fork", follow_fork)
        self.write("set_event_pid", " ".join(str(p) for p in pids))

    def set_event_notrace_pids(self, pids: list[int]) -> bool:
        """Never record these tasks' events (the session's own processes); False when the
        kernel has no `set_event_notrace_pid` (before 5.8)."""
        if not self.exists("set_event_notrace_pid"):
            return False
        self.write("set_event_notrace_pid", " ".join(str(p) for p in pids))
        return True

    def set_buffer_percent(self, percent: int) -> bool:
        """How full a CPU's buffer must be before the kernel wakes a reader polling it (0: at
        the first event); False when the kernel has no `buffer_percent`."""
        if not self.exists("buffer_percent"):
            return False
        self.write("buffer_percent", str(percent))
        return True

    def set_clock(self, clock: str) -> None:
        available = self.read("trace_clock").replace("[", "").replace("]", "").split()
        if clock not in available:
            raise TracefsError(
                f"trace clock {clock!r} is not available",
                hint=f"choose one of: {', '.join(available)}",
            )
        self.write("trace_clock", clock)

    def clock(self) -> str:
        text = self.read("trace_clock")
        start = text.index("[")
        return text[start + 1 : text.index("]", start)]

    def set_buffer_size_kb(self, kb: int) -> None:
        self.write("buffer_size_kb", str(kb))

    def subbuffer_size(self) -> int:
        """Bytes per ring-buffer sub-buffer (a page, unless buffer_subbuf_size_kb says more)."""
        if self.exists("buffer_subbuf_size_kb"):
            return int(self.read("buffer_subbuf_size_kb").strip()) * 1024
        return os.sysconf("SC_PAGE_SIZE")

    def cpu_stats(self, cpu: int) -> CpuStats:
        return CpuStats.parse(self.read(f"per_cpu/cpu{cpu}/stats"))

    def trace_pipe_raw(self, cpu: int) -> Path:
        return self.root / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw"

    def tracing_on(self, on: bool) -> None:
        self.write("tracing_on", "1" if on else "0")
