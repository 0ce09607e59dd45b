"""A quiet tracer (issue 11 item 5): probescope's own processes — the session, its recorder and
its watchdog — never appear in its event stream, and while the traced program is idle they
read no file on a timer (the recorder and the watchdog make no system call at all)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.spool import idle_wait_for
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.system.kernel import RunningKernel
from support.tracefs import tracefs_root, wait_until_armed, watchdog_of

pytestmark = pytest.mark.root

# x86_64 system call numbers of what touches the file system (pipes and pidfds do not count):
# open, stat, fstat, lstat, pread64, getdents64, openat, newfstatat, readlinkat, statx.
FILE_SYSCALLS = {2, 4, 5, 6, 17, 217, 257, 262, 267, 332}


def helpers_of(session: int, timeout: float = 10.0) -> dict[str, list[int]]:
    """The session's threads, its recorder (a child named probescope-rec) and its watchdog.

    The recorder names itself just after the fork, while the session goes on arming: on a slow
    guest its comm may still be the session's when the events are already enabled."""
    found: dict[str, list[int]] = {
        "session": [int(t) for t in os.listdir(f"/proc/{session}/task")],
        "recorder": [],
        "watchdog": [],
    }
    deadline = time.monotonic() + timeout
    while not found["recorder"] and time.monotonic() < deadline:
        children = Path(f"/proc/{session}/task/{session}/children").read_text().split()
        for child in children:
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "probescope-rec":
                    found["recorder"].append(int(child))
            except OSError:
                continue
        if not found["recorder"]:
            time.sleep(0.01)
    watchdog = watchdog_of(session)
    if watchdog is not None:
        found["watchdog"].append(watchdog)
    return found


def start(*args: str, **kw: object) -> subprocess.Popen[str]:
    options: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    options.update(kw)
    return subprocess.Popen(
        [sys.executable, "-m", "probescope", "trace", "--engine", "tracefs", *args],
        text=True,
        **options,  # type: ignore[call-overload]
    )


def test_a_system_wide_syscall_trace_shows_none_of_probescopes_processes(
    tmp_path: Path,
) -> None:
    if not (Path("/sys/kernel/tracing/events/raw_syscalls/sys_enter")).exists():
        pytest.skip("this kernel has no raw_syscalls tracepoints")
    output = tmp_path / "syscalls.jsonl"
    proc = start("-d", "3", "-f", "jsonl", "-o", str(output), "t:raw_syscalls:sys_enter")
    wait_until_armed_tracepoint(proc.pid)
    helpers = helpers_of(proc.pid)
    for _ in range(20):  # syscalls of the test itself: the trace does record others
        time.sleep(0.01)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert helpers["recorder"] and helpers["watchdog"], helpers
    ours = {pid for pids in helpers.values() for pid in pids}
    records = [json.loads(line) for line in output.read_text().splitlines()]
    seen = {r["tid"] for r in records} | {r["pid"] for r in records}
    assert os.getpid() in seen, "the trace records other processes' system calls"
    assert seen & ours == set(), {name: sorted(set(pids) & seen) for name, pids in helpers.items()}


def wait_until_armed_tracepoint(pid: int, timeout: float = 60.0) -> None:
    root = tracefs_root()
    assert root is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for instance in (root / "instances").glob(f"probescope-{pid}-*"):
            enable = instance / "events/raw_syscalls/sys_enter/enable"
            try:
                if enable.read_text().strip() == "1":
                    return
            except OSError:
                pass
        time.sleep(0.02)
    raise AssertionError("the session never enabled its tracepoint")


@pytest.fixture
def observer() -> Iterator[Instance]:
    """An instance of the test's own recording raw system calls of chosen tasks."""
    root = tracefs_root()
    assert root is not None
    instance = Instance.create(Tracefs(root), f"observer-{os.getpid()}")
    try:
        yield instance
    finally:
        instance.write("events/raw_syscalls/sys_enter/enable", "0")
        instance.remove()


def test_an_idle_session_reads_no_file_on_a_timer(stepper: Path, observer: Instance) -> None:
    release = RunningKernel.read().grammar.release
    if idle_wait_for(release) is not None:
        pytest.skip(
            f"Linux {'.'.join(map(str, release))}: its ring-buffer poll does not wake the "
            "recorder, which looks every 0.1 s instead (engines/tracefs/spool.py)"
        )
    proc = start("-c", str(stepper), f"{stepper}:step", stdin=subprocess.PIPE)
    try:
        wait_until_armed(proc.pid)
        # The session's start ends a moment after its probes are enabled: it releases the
        # command and reads saved_cmdlines once (its task names). Idle begins after that.
        time.sleep(0.3)
        helpers = helpers_of(proc.pid)
        assert helpers["recorder"] and helpers["watchdog"], helpers
        pids = [pid for group in helpers.values() for pid in group]
        observer.write("set_event_pid", " ".join(map(str, pids)))
        observer.write("events/raw_syscalls/sys_enter/enable", "1")
        time.sleep(1.0)  # the traced program waits for input: nothing to record
        observer.write("events/raw_syscalls/sys_enter/enable", "0")
    finally:
        proc.communicate(timeout=30)
    calls: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for line in observer.read("trace").splitlines():
        if line.startswith("#") or "sys_enter:" not in line:
            continue
        tid = int(line.split("[", 1)[0].rsplit("-", 1)[1])
        number = int(line.split("NR ", 1)[1].split(" ", 1)[0])
        calls[tid][number] += 1
    for helper in ("recorder", "watchdog"):
        for pid in helpers[helper]:
            assert not calls.get(pid), f"the {helper} made system calls while idle: {calls[pid]}"
    for tid in helpers["session"]:
        touched = {n: c for n, c in calls.get(tid, {}).items() if n in FILE_SYSCALLS}
        assert touched == {}, f"the session touched files while idle: {dict(calls[tid])}"
