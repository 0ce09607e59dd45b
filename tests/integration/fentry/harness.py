"""Helpers for the fentry engine's tests: target programs, attaching, and what a restored
process must look like (text equal to the file, no code area of ours left)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from probescope.engines.fentry.area import MAGIC
from probescope.engines.fentry.engine import FentryEngine
from support.build import compile_program

TARGETS = Path(__file__).resolve().parents[2] / "targets"


def skip_reason() -> str | None:
    state = FentryEngine().available()
    return None if state.ok else state.reason


requires_fentry = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def target(name: str, flags: Sequence[str] = ("-O1", "-g")) -> Path:
    folder = "fentry" if (TARGETS / "fentry" / name).exists() else "ptrace"
    language = "c++" if name.endswith(".cc") else "c"
    return compile_program(
        (TARGETS / folder / name).read_text(), name.split(".")[0], tuple(flags), language=language
    )


def hammer() -> Path:
    return target("hammer.c", ("-O1", "-g", "-pthread"))


def hammer_specs(path: Path) -> list[str]:
    return [
        f"{path}:mix a=arg1:s64 b=arg2:s64",
        f"r:{path}:mix r=retval:s64",
        f"r:{path}:deep",
        f"{path}:bail",
        f"r:{path}:bail",
        f"r:{path}:layer",
    ]


def start(argv: Sequence[str | Path]) -> subprocess.Popen[str]:
    """Start a target; with "stdin" as its argument it runs until its stdin is closed."""
    process = subprocess.Popen(
        [str(a) for a in argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.1)
    return process


def our_areas(pid: int) -> list[int]:
    """Start addresses of anonymous r-x mappings that begin with our magic."""
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            parts = line.split()
            if parts[1] != "r-xp" or len(parts) > 5:
                continue
            start = int(parts[0].split("-")[0], 16)
            try:
                mem.seek(start)
                if mem.read(len(MAGIC)) == MAGIC:
                    found.append(start)
            except OSError:
                continue
    return found


def libc_path(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "libc.so" in line and "r-xp" in line:
                return line.split()[-1]
    raise AssertionError("no libc mapped")
