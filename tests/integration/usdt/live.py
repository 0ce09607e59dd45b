"""LiveUsdt: uprobes defined by hand from probescope's USDT sites, and their events read back.

A LiveUsdt owns a private instance `instances/probescope-usdt-<pid>` in which it defines
`p:probescope_usdt_<pid>/EV PATH:0xPC[(0xSEM)] argN=...` events (uprobe_events opened
O_WRONLY|O_APPEND, never truncated), enables them, runs a program and parses its events back;
`close()` disables, deletes and removes everything.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from probescope.symbols.usdt import UsdtProbe, UsdtSite
from support.tracefs import append as tracefs_append
from support.tracefs import write as tracefs_write

OWNER = os.getpid()
GROUP = f"probescope_usdt_{OWNER}"
INSTANCE = f"probescope-usdt-{OWNER}"
_numbers = itertools.count()
_LINE = re.compile(
    r"^\s*(?P<comm>.*)-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:[^\s\d]\S*\s+)?(?P<ts>\d+\.\d+): (?P<event>\w+): \((?P<ip>0x[0-9a-f]+)\)(?P<args>.*)$"
)
_ARG = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


class Record(NamedTuple):
    """One event read back from the instance's `trace`: event name, probed address, arguments."""

    pid: int
    event: str
    ip: int
    args: dict[str, str]


class LiveUsdt:
    """The events of one test in its private instance; `close()` undoes everything."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.instance = root / "instances" / INSTANCE
        self.instance.mkdir()
        self.events: list[str] = []
        self.sites: dict[str, tuple[UsdtProbe, UsdtSite]] = {}
        self.enabled = False
        self.closed = False

    def define(
        self,
        path: str | Path,
        probe: UsdtProbe,
        site: UsdtSite,
        args: Sequence[str] | None = None,
        *,
        with_semaphore: bool = True,
    ) -> str:
        """Define one uprobe at `site` (its fetchargs unless `args` is given); its event name."""
        event = f"u{next(_numbers)}_{probe.name}"[:63]
        location = site.location(str(path))
        if not with_semaphore:
            location = f"{path}:{site.pc_offset:#x}"
        if args is None:
            args = [a.definition for a in site.args if a.definition is not None]
        command = " ".join([f"p:{GROUP}/{event}", location, *args])
        try:
            tracefs_append(self.root / "uprobe_events", command + "\n")
        except OSError as error:
            log = (self.root / "error_log").read_text().strip().splitlines()[-3:]
            raise AssertionError(f"kernel refused {command!r}: {error}; {log}") from None
        self.events.append(event)
        self.sites[event] = (probe, site)
        return event

    def enable(self) -> None:
        tracefs_write(self.instance / "events" / GROUP / "enable", "1")
        self.enabled = True

    def disable(self) -> None:
        if self.enabled:
            tracefs_write(self.instance / "events" / GROUP / "enable", "0")
            self.enabled = False

    def run(self, *argv: str | Path, timeout: float = 60) -> tuple[int, str]:
        """Run a program to its end (it must succeed); (pid, its stdout)."""
        process = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, text=True)
        out, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"{argv} exited with {process.returncode}"
        return process.pid, out

    def records(self, pid: int | None = None) -> list[Record]:
        """This instance's events (of `pid` when given), in trace order."""
        found = []
        for line in (self.instance / "trace").read_text().splitlines():
            if line.startswith("#"):
                continue
            match = _LINE.match(line)
            assert match is not None, f"cannot read trace line {line!r}"
            if pid is not None and int(match["pid"]) != pid:
                continue
            args = {name: value for name, value in _ARG.findall(match["args"])}
            found.append(Record(int(match["pid"]), match["event"], int(match["ip"], 16), args))
        return found

    def close(self) -> None:
        """Disable, delete every event, remove the instance (idempotent)."""
        if self.closed:
            return
        self.closed = True
        problems: list[BaseException] = []
        try:
            self.disable()
        except OSError as error:
            problems.append(error)
        for event in reversed(self.events):
            try:
                tracefs_append(self.root / "uprobe_events", f"-:{GROUP}/{event}\n")
            except OSError as error:
                if error.errno != errno.ENOENT:
                    problems.append(error)
        self.events.clear()
        try:
            self.instance.rmdir()
        except OSError as error:
            problems.append(error)
        if problems:
            raise problems[0]
