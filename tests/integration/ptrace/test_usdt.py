"""USDT probes with semaphores: Python's `python:gc__start` fires only while someone holds its
semaphore up; the engine adds one like the kernel's (REF) and takes it back on detach."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from integration.ptrace.harness import run_traced
from probescope.engines.base import Target
from probescope.engines.ptrace import PtraceEngine
from probescope.events import EventBatch
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe

PYTHON = Path(os.path.realpath(sys.executable)) if "python3" in sys.executable else None


def _note(path: Path, name: str) -> tuple[int, int]:
    """(probe site, semaphore) file offsets of an SDT note, from readelf."""
    notes = subprocess.run(
        ["readelf", "-n", "--wide", str(path)], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(
        rf"Name: {name}\s+Location: (0x[0-9a-f]+), Base: 0x[0-9a-f]+, "
        r"Semaphore: (0x[0-9a-f]+)",
        notes,
    )
    if match is None:
        pytest.skip(f"{path} has no {name} SDT note")
    loads = subprocess.run(
        ["readelf", "-lW", str(path)], capture_output=True, text=True, check=True
    ).stdout
    segments = [
        tuple(int(x, 16) for x in line.split()[1:5])
        for line in loads.splitlines()
        if line.strip().startswith("LOAD")
    ]

    def offset(vaddr: int) -> int:
        for file_offset, start, _, size in segments:
            if start <= vaddr < start + size:
                return vaddr - start + file_offset
        raise LookupError(hex(vaddr))

    return offset(int(match[1], 16)), offset(int(match[2], 16))


def _python() -> Path:
    for candidate in ("/usr/bin/python3.11", "/usr/bin/python3"):
        if os.path.exists(candidate):
            return Path(os.path.realpath(candidate))
    pytest.skip("no system python3 with SDT notes")


def test_semaphore_enables_the_probe_and_is_taken_back():
    python = _python()
    site, semaphore = _note(python, "gc__start")
    spec = parse_kernel_probe(f"p:ptrace_test/gc_start {python}:0x{site:x}(0x{semaphore:x})")
    assert isinstance(spec, ProbeSpec)
    probe = ResolvedProbe.from_uprobe_spec(spec)
    program = "import gc\nfor g in (0, 1, 2): gc.collect(g)\nprint('collected')"
    run = run_traced([probe], [str(python), "-S", "-c", program])
    assert run.stdout == b"collected\n"
    # Without the semaphore the interpreter skips the probe site: no event at all.
    assert len(run.named("gc_start")) >= 3

    # Attached to a running interpreter: the semaphore goes up while we are there, and down.
    sleeper = subprocess.Popen(
        [
            str(python),
            "-S",
            "-c",
            "import gc, sys, time\nprint('ready', flush=True)\n"
            "while sys.stdin.readline(): gc.collect(1); print('done', flush=True)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sleeper.stdout.readline() == "ready\n"
        address = _semaphore_address(sleeper.pid, python, semaphore)
        assert _read_u16(sleeper.pid, address) == 0
        engine = PtraceEngine()
        engine.attach([probe], Target(pids=(sleeper.pid,)))
        assert _read_u16(sleeper.pid, address) == 1
        sleeper.stdin.write("go\n")
        sleeper.stdin.flush()
        events = []
        for item in engine.events():
            if not isinstance(item, EventBatch):
                events.append(item)
                break
        assert events[0].name == "gc_start" and events[0].pid == sleeper.pid
        assert _read_u16(sleeper.pid, address) == 0
        assert sleeper.stdout.readline() == "done\n"
    finally:
        sleeper.kill()
        sleeper.wait()


def _semaphore_address(pid: int, path: Path, offset: int) -> int:
    key = os.stat(path)
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and int(parts[4]) == key.st_ino and "w" in parts[1]:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                pgoff = int(parts[2], 16)
                if pgoff <= offset < pgoff + end - start:
                    return start + offset - pgoff
    raise LookupError("semaphore not mapped")


def _read_u16(pid: int, address: int) -> int:
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(address)
        return int.from_bytes(mem.read(2), "little")
