"""A closed output (issue 11 item 2): `probescope ... | head` ends quietly and cleanly for every
command and format — no traceback, teardown run (nothing left in tracefs, the command not left
behind), exit status 141 as a Unix tool killed by SIGPIPE — whether the reader leaves after a
line or before anything was written, and even when it took stderr with it."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from probescope.engines.registry import BY_NAME, availability
from support.build import compile_program
from support.tracefs import owned_by, skip_reason

TARGETS = Path(__file__).parents[1] / "targets"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@functools.cache
def busy() -> Path:
    return compile_program((TARGETS / "busy.c").read_text(), "busy", ("-O1", "-g"))


@functools.cache
def stepper() -> Path:
    return compile_program((TARGETS / "stepper.c").read_text(), "stepper", ("-O1", "-g"))


def into_closed_pipe(
    args: Sequence[str], *, lines_first: int = 1, with_stderr: bool = False, timeout: float = 60
) -> tuple[int, str, int]:
    """Run `probescope ARGS` into a pipe whose reader reads `lines_first` lines (0: none) and
    then closes it; (exit status, stderr, pid)."""
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "r")
    if lines_first == 0:
        reader.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "probescope", *args],
        stdout=write_end,
        stderr=write_end if with_stderr else subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    os.close(write_end)
    try:
        for _ in range(lines_first):
            assert reader.readline(), "the command wrote nothing"
        if lines_first:
            reader.close()
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = err or ""
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return proc.returncode, err, proc.pid


@functools.cache
def engines() -> list[str]:
    usable = ["ptrace"]
    if skip_reason() is None:
        usable.append("tracefs")
    if availability(BY_NAME["bpf"]).ok:
        usable.append("bpf")
    return usable


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
@pytest.mark.parametrize("engine", ["tracefs", "ptrace", "bpf"])
def test_trace_ends_quietly_when_its_reader_leaves(engine: str, fmt: str) -> None:
    if engine not in engines():
        pytest.skip(f"the {engine} engine cannot run here")
    program = busy()
    status, err, pid = into_closed_pipe(
        ["trace", "--engine", engine, "-f", fmt, "-c", f"{program} 2000000", f"{program}:work"]
    )
    assert status == 141, err
    assert f"({engine} engine, output closed)" in err
    assert owned_by(pid) == []


@pytest.mark.parametrize("engine", ["tracefs", "bpf"])
def test_trace_notices_a_reader_gone_before_any_event(engine: str) -> None:
    """Nothing to write for a while (the program waits for input): the session still ends,
    seeing the pipe's reader gone, instead of tracing on for nobody."""
    if engine not in engines():
        pytest.skip(f"the {engine} engine cannot run here")
    program = stepper()
    started = time.monotonic()
    status, err, pid = into_closed_pipe(
        ["trace", "--engine", engine, "-c", str(program), f"{program}:step"], lines_first=0
    )
    assert time.monotonic() - started < 30
    assert status == 141, err
    assert owned_by(pid) == []


def test_a_reader_that_took_stderr_too() -> None:
    program = busy()
    engine = engines()[-1]
    status, _, pid = into_closed_pipe(
        ["trace", "--engine", engine, "-c", f"{program} 2000000", f"{program}:work"],
        with_stderr=True,
    )
    assert status == 141
    assert owned_by(pid) == []


@pytest.mark.parametrize(
    "args",
    [
        ["symbols", LIBC],
        ["resolve", "c:str*"],
        ["trace", "--dry-run", "c:str*"],
        ["engines"],
        ["--help"],
        ["trace", "--help"],
        ["list", "tracepoints"],
        ["list", "usdt", "USDT"],
    ],
    ids=lambda args: " ".join(args),
)
@pytest.mark.parametrize("lines_first", [0, 1], ids=["closed-at-once", "after-a-line"])
def test_every_command_ends_quietly_into_a_closed_pipe(args: list[str], lines_first: int) -> None:
    if args[:2] == ["list", "tracepoints"] and skip_reason() is not None:
        pytest.skip(skip_reason())
    if args[-1] == "USDT":
        args = [*args[:-1], str(usdt_program())]
    status, err, _ = into_closed_pipe(args, lines_first=lines_first)
    # A short output may fit the pipe whole before the reader leaves: then it ends with 0.
    assert status in (0, 141), err
    if lines_first == 0:
        assert status == 141, err
    assert "error" not in err.lower(), err


def test_report_ends_quietly_into_a_closed_pipe(tmp_path: Path) -> None:
    program = busy()
    recording = tmp_path / "run.dat"
    made = subprocess.run(
        [
            *(sys.executable, "-m", "probescope", "record", "-q", "-o", str(recording)),
            *("--engine", engines()[-1], "-c", f"{program} 3000", f"{program}:work"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    for lines_first in (0, 1):
        status, err, _ = into_closed_pipe(["report", str(recording)], lines_first=lines_first)
        assert status == 141, err


@functools.cache
def usdt_program() -> Path:
    return compile_program(
        (TARGETS / "usdt" / "usdt_demo.c").read_text(), "usdt_demo", ("-O1", "-g")
    )
