"""What tests read of a live process: its status fields, its tracer, whether its text still
equals the file's bytes (no trap or jump left behind), and a line of its output with a timeout."""

from __future__ import annotations

import os
import select
from pathlib import Path
from typing import IO


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict of its fields."""
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def tracer_of(pid: int) -> int:
    """The pid of the process's ptrace tracer (0 when untraced)."""
    return int(proc_status(pid)["TracerPid"])


def readline_within(stream: IO[str], timeout: float) -> str:
    """A line of `stream`, or "" when none came within `timeout` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


def text_differences(pid: int, path: str | Path) -> list[int]:
    """Addresses where the process's executable mappings of `path` differ from the file."""
    key = os.stat(path)
    diffs = []
    with (
        open(f"/proc/{pid}/maps") as maps,
        open(f"/proc/{pid}/mem", "rb") as mem,
        open(path, "rb") as f,
    ):
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or "x" not in parts[1] or int(parts[4]) != key.st_ino:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            f.seek(int(parts[2], 16))
            expected = f.read(end - start)
            mem.seek(start)
            actual = mem.read(len(expected))
            diffs += [
                start + i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b
            ]
    return diffs
