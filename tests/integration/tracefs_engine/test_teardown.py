"""Teardown on every exit path of the `probescope trace` command, and reaping after SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.tracefs import owned_by, watchdog_of

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
    options: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    options.update(kw)
    proc = subprocess.Popen(
        [sys.executable, "-m", "probescope", *args],
        text=True,
        **options,  # type: ignore[call-overload]
    )
    _started.append(proc)
    return proc


def wait_for_first_event(proc: subprocess.Popen[str], event: str = "tick:") -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert event in line, line + (proc.stderr.read() if proc.stderr else "")
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


def gone_within(pid: int, seconds: float) -> float | None:
    """How long it took the session of `pid`'s objects to disappear, or None."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not owned_by(pid):
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def test_a_sigkilled_session_is_cleaned_up_by_its_watchdog_within_a_second(
    ticker: Path,
) -> None:
    """Issue 11 item 4: the watchdog holds a pidfd of the session and reaps its objects when it
    dies; the traced program runs on, no longer trapping, and the watchdog exits."""
    program = subprocess.Popen([str(ticker), "-1", "1000"], stdout=subprocess.PIPE, text=True)
    try:
        proc = probescope("trace", "-p", str(program.pid), f"{ticker}:tick")
        wait_for_first_event(proc)
        watchdog = watchdog_of(proc.pid)
        assert watchdog is not None, "a tracefs session runs a watchdog"
        victim = proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        took = gone_within(victim, 2.0)
        assert took is not None and took < 1.5, f"left behind: {owned_by(victim)}"
        deadline = time.monotonic() + 5
        while Path(f"/proc/{watchdog}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not Path(f"/proc/{watchdog}/comm").exists() or (
            Path(f"/proc/{watchdog}/comm").read_text().strip() != "probescope-wd"
        ), "the watchdog exits once its job is done"
        assert program.poll() is None
    finally:
        program.send_signal(signal.SIGTERM)
        out, _ = program.communicate(timeout=10)
    assert program.returncode == 0 and out.startswith("ticks ")


def _memory_cgroup() -> tuple[Path, str, str] | None:
    """(where to make a memory cgroup, its limit file, its OOM-kill counter file)."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        return v1, "memory.limit_in_bytes", "memory.oom_control"
    for v2 in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            return v2, "memory.max", "memory.events"
    return None


def test_an_oom_killed_session_is_cleaned_up_by_its_watchdog(busy: Path) -> None:
    """The kernel's OOM killer, for real: the session is moved alone into a memory cgroup
    with a tiny limit while it streams a busy program's events; its next allocations there
    get it killed (SIGKILL, as the OOM killer does); the watchdog, left outside, reaps."""
    found = _memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup controller (v1 memory or v2 with memory) to OOM in")
    hierarchy, limit_file, counter_file = found
    group = hierarchy / f"probescope-oom-test-{os.getpid()}"
    program = subprocess.Popen([str(busy)], stdout=subprocess.PIPE, text=True)
    try:
        with tempfile.TemporaryFile("w+") as output:
            proc = probescope("trace", "-p", str(program.pid), f"{busy}:work", stdout=output)
            deadline = time.monotonic() + 60
            while os.fstat(output.fileno()).st_size == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert watchdog_of(proc.pid) is not None
            group.mkdir()
            (group / limit_file).write_text(str(64 * 1024))
            # The session alone: its recorder and watchdog stay in the cgroup they were in.
            (group / "cgroup.procs").write_text(str(proc.pid))
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        counters = dict(line.split() for line in (group / counter_file).read_text().splitlines())
        assert int(counters["oom_kill"]) >= 1, counters
        took = gone_within(proc.pid, 2.0)
        assert took is not None and took < 1.5, f"left behind: {owned_by(proc.pid)}"
        assert program.poll() is None
    finally:
        program.send_signal(signal.SIGTERM)
        out, _ = program.communicate(timeout=10)
        with contextlib.suppress(OSError):
            group.rmdir()
    assert program.returncode == 0 and out.startswith("calls ")


def test_the_watchdog_never_outlives_a_session_that_ended(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} -1 2000", f"{ticker}:tick")
    wait_for_first_event(proc)
    watchdog = watchdog_of(proc.pid)
    assert watchdog is not None
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{watchdog}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not Path(f"/proc/{watchdog}").exists()


def kill_with_its_watchdog(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the session and its watchdog (as a machine crash would): what is left is for
    the next run or `probescope cleanup`."""
    watchdog = watchdog_of(proc.pid)
    assert watchdog is not None
    os.kill(watchdog, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)


def test_sigkill_leftovers_are_reaped_by_the_next_run(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} -1 2000", f"{ticker}:tick")
    wait_for_first_event(proc)
    victim = proc.pid
    kill_with_its_watchdog(proc)
    out, _ = proc.communicate(timeout=30)
    assert "ticks" in out, "the command got SIGTERM when probescope died, and ended normally"
    time.sleep(0.5)
    left = owned_by(victim)
    assert left, "SIGKILL of the session and its watchdog leaves the session's objects behind"
    again = probescope("trace", "-c", f"{ticker} 3 1000", f"{ticker}:tick")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert "leftovers of dead probescope sessions" in err
    assert owned_by(victim) == []


def test_cleanup_command(ticker: Path) -> None:
    proc = probescope("trace", "-c", f"{ticker} -1 2000", f"{ticker}:tick")
    wait_for_first_event(proc)
    victim = proc.pid
    kill_with_its_watchdog(proc)
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
