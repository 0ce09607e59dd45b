"""Teardown on every exit path of the `probescope trace` command, and reaping after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.tracefs import leftovers

pytestmark = pytest.mark.root


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def no_stray_processes() -> Iterator[None]:
    """A failing test must not leave probescope (or, through PR_SET_PDEATHSIG, its command)
    running."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def probescope(*args: str, **kw: object) -> subprocess.Popen[str]:
    """`probescope ARGS`, a `trace` on the tracefs engine (whose kernel objects these tests
    watch; `auto` would pick the bpf engine where it can run)."""
    if args[:1] == ("trace",):
        args = ("trace", "--engine", "tracefs", *args[1:])
    proc = subprocess.Popen(
        [sys.executable, "-m", "probescope", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[arg-type]
    )
    _started.append(proc)
    return proc


def owned_by(pid: int) -> list[str]:
    return [
        line for line in leftovers() if f"probescope_{pid}_" in line or f"probescope-{pid}-" in line
    ]


def wait_for_first_event(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "tick:" in line, line + (proc.stderr.read() if proc.stderr else "")
    assert owned_by(proc.pid), "the session's objects exist while it runs"
    return line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_ends_session_cleanly(ticker: Path, signum: int) -> None:
    proc = probescope(
        "trace", "-p", str(os.getpid()), "-c", f"{ticker}", f"{ticker}:tick i=arg1:s64"
    )
    proc.kill()  # -c and -p are exclusive: argparse refuses before touching anything
    proc.wait()
    proc = probescope("trace", "-c", f"{ticker} -1 2000", f"{ticker}:tick i=arg1:s64")
    wait_for_first_event(proc)
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "events in" in err
    assert owned_by(proc.pid) == []


def test_target_exit_ends_session(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} 25 1000", f"{ticker}:tick i=arg1:s64")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [line for line in out.splitlines() if "tick:" in line]
    assert [int(line.rsplit("i=", 1)[1]) for line in lines] == list(range(25))
    assert "ticks 25" in out
    assert "command exited with status 0" in err
    assert owned_by(proc.pid) == []


def test_duration_and_count(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} -1 1000", "-n", "5", f"{ticker}:tick")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len([line for line in out.splitlines() if "tick:" in line]) == 5
    assert "terminated" in err, "the command ends with the session"
    proc = probescope("trace", "-d", "0.5", "-q", "-c", f"{ticker} -1 1000", f"{ticker}:tick")
    started = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 60, "-d ends the session (the ticker never would)"
    assert proc.returncode == 0 and err == ""


def test_traced_program_is_undisturbed_by_sigterm_of_probescope(ticker: Path) -> None:
    program = subprocess.Popen([str(ticker), "-1", "2000"], stdout=subprocess.PIPE, text=True)
    proc = probescope("trace", "-p", str(program.pid), f"{ticker}:tick")
    wait_for_first_event(proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    time.sleep(0.05)
    assert program.poll() is None, "the program keeps running after probescope ends"
    program.send_signal(signal.SIGTERM)
    out, _ = program.communicate(timeout=10)
    assert program.returncode == 0 and out.startswith("ticks ")


def test_sigkill_leftovers_are_reaped_by_the_next_run(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} -1 2000", f"{ticker}:tick")
    wait_for_first_event(proc)
    victim = proc.pid
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert "ticks" in out, "the command got SIGTERM when probescope died, and ended normally"
    left = owned_by(victim)
    assert left, "SIGKILL leaves the session's objects behind"
    again = probescope("trace", "-c", f"{ticker} 3 1000", f"{ticker}:tick")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert "leftovers of dead probescope sessions" in err
    assert owned_by(victim) == []


def test_cleanup_command(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} -1 2000", f"{ticker}:tick")
    wait_for_first_event(proc)
    victim = proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    dry = subprocess.run(
        [sys.executable, "-m", "probescope", "cleanup", "--dry-run"], capture_output=True, text=True
    )
    assert f"probescope-{victim}-" in dry.stdout
    assert owned_by(victim)
    done = subprocess.run(
        [sys.executable, "-m", "probescope", "cleanup"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert owned_by(victim) == []
