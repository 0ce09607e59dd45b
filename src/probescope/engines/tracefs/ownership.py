"""Names that say who owns a kernel object, so a later run can reap what a dead session left.

A group is `probescope_<pid>_<starttime>` and an instance `probescope-<pid>-<starttime>-<n>`,
where <starttime> is the owner's start time in clock ticks since boot (/proc/PID/stat field 22):
together they identify a process even after its pid is reused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

PREFIX = "probescope"
_OWNER = re.compile(r"^probescope[_-](\d+)[_-](\d+)(?:[_-].*)?$")


def process_start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 overall; fields here start at field 3


@dataclass(frozen=True)
class Owner:
    pid: int
    start_time: int

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, process_start_time(pid) or 0)

    @classmethod
    def of(cls, name: str) -> Owner | None:
        match = _OWNER.match(name)
        return cls(int(match.group(1)), int(match.group(2))) if match else None

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time

    def group_name(self, serial: int = 0) -> str:
        base = f"{PREFIX}_{self.pid}_{self.start_time}"
        return base if serial == 0 else f"{base}_{serial}"

    def instance_name(self, serial: int = 0) -> str:
        return f"{PREFIX}-{self.pid}-{self.start_time}-{serial}"
