"""Ask the live kernel whether it accepts a definition, and what it prints back for it."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    line: str | None = None  # what the events file shows for it
    error: str | None = None  # errno name and error_log text when refused


class KernelOracle:
    """Writes one definition at a time to an events file and removes what it created."""

    def __init__(self, root: Path, events_file: str = "uprobe_events") -> None:
        self.root = root
        self.path = root / events_file

    def _lines(self) -> list[str]:
        return self.path.read_text().splitlines()

    def _write(self, text: str) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode() + b"\n")
            return 0
        except OSError as error:
            return error.errno or errno.EINVAL
        finally:
            os.close(fd)

    def judge(self, definition: str) -> Verdict:
        before = set(self._lines())
        (self.root / "error_log").write_text("")
        code = self._write(definition)
        created = [line for line in self._lines() if line not in before]
        for line in created:
            head = line.split()[0]
            self._write("-:" + head.split(":", 1)[1])
        if code:
            log = (self.root / "error_log").read_text().strip().splitlines()
            return Verdict(False, error=f"{errno.errorcode.get(code, code)}: {' '.join(log[:1])}")
        if len(created) != 1:
            return Verdict(True, line=None, error=f"created {len(created)} lines")
        return Verdict(True, line=created[0])
