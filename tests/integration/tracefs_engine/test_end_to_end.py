"""The tracefs engine end to end: real programs, the live kernel, every event in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from probescope.errors import ProbescopeError, TracefsError
from probescope.events import Event
from probescope.language.model import ProbeKind
from probescope.session import Session

pytestmark = pytest.mark.root


def trace(specs: list[str], command: list[str], **kw: object) -> tuple[list[Event], Session]:
    session = Session(specs, engine="tracefs", command=command, **kw)  # type: ignore[arg-type]
    with session:
        events = list(session.events(duration=30))
    return events, session


def test_loop_events_arrive_in_order_with_their_args(loop: Path) -> None:
    events, session = trace(
        [
            f"{loop}:func_1 a=arg1:s32",
            f"{loop}:func_2 a=arg1:s64 b=arg2:s32",
            f"r:{loop}:func_2 ret=retval:s64",
            f"{loop}:named name=+0(arg1):string first=+0(arg2):s32 second=+4(arg2):s16 "
            "flags=+6(arg2):u8",
        ],
        [str(loop), "6"],
    )
    names = [e.name for e in events]
    assert names == ["func_1", "func_2", "func_2__return", "named"] * 6
    for i in range(6):
        f1, f2, ret, named = events[4 * i : 4 * i + 4]
        assert f1.arg("a") == i
        assert (f2.arg("a"), f2.arg("b")) == (i * 100, -i)
        assert ret.arg("ret") == i * 100 + i
        assert ret.kind is ProbeKind.URETPROBE and ret.ret_ip is not None
        assert named.arg_dict() == {
            "name": ["alpha", "beta", "gamma"][i % 3],
            "first": i,
            "second": -i,
            "flags": (i * 7) & 0xFF,
        }
    assert all(e.comm == "loop" for e in events), [e.comm for e in events]
    assert len({e.pid for e in events}) == 1 and events[0].pid == events[0].tid
    timestamps = [e.timestamp_ns for e in events]
    assert timestamps == sorted(timestamps)
    summary = session.summary()
    assert summary.lost == 0
    assert summary.hits["uprobes/func_1"] == 6
    assert summary.stats is not None and summary.stats.command_status == 0


def test_threads_are_followed(threads: Path) -> None:
    events, _ = trace([f"{threads}:work thread=arg1:s32 i=arg2:s32"], [str(threads)])
    assert len(events) == 100
    by_thread: dict[int, list[int]] = {}
    tids: dict[int, set[int]] = {}
    for event in events:
        by_thread.setdefault(event.arg("thread"), []).append(event.arg("i"))
        tids.setdefault(event.arg("thread"), set()).add(event.tid)
    assert sorted(by_thread) == [0, 1, 2, 3]
    assert all(values == list(range(25)) for values in by_thread.values())
    assert all(len(t) == 1 for t in tids.values())
    assert len({next(iter(t)) for t in tids.values()}) == 4
    pids = {e.pid for e in events}
    assert len(pids) == 1, "threads report their process id"
    assert all(e.tid != e.pid for e in events)


def test_forked_children_are_followed(forks: Path) -> None:
    events, _ = trace([f"{forks}:step generation=arg1:s32"], [str(forks)])
    assert sorted(e.arg("generation") for e in events) == [0, 1, 2]
    assert len({e.pid for e in events}) == 3


def test_python_calling_libc_malloc() -> None:
    code = "import ctypes; [ctypes.CDLL(None).malloc(123457) for _ in range(3)]"
    events, _ = trace(["c:malloc size=arg1:u64"], [sys.executable, "-c", code])
    sizes = [e.arg("size") for e in events]
    assert sizes.count(123457) == 3
    assert all(e.comm.startswith("python") for e in events)


def test_bash_builtin_functions() -> None:
    events, _ = trace(
        ["bash:execute_command", "r:bash:execute_command status=retval:s32"],
        ["bash", "-c", "true; false; exit 0"],
    )
    assert [e.name for e in events].count("execute_command") >= 2
    assert any(e.name == "execute_command__return" for e in events)


def test_pid_filter_excludes_other_processes(loop: Path) -> None:
    other = subprocess.Popen([str(loop), "200", "wait"], stdin=subprocess.PIPE)
    try:
        events, _ = trace([f"{loop}:func_1"], [str(loop), "5"])
    finally:
        assert other.stdin is not None
        other.communicate(b"go\n", timeout=10)
    assert len(events) == 5
    assert {e.pid for e in events} != {other.pid}


def test_attach_to_running_process(loop: Path) -> None:
    proc = subprocess.Popen([str(loop), "7", "wait"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    with Session([f"{loop}:func_1 a=arg1:s32"], engine="tracefs", pids=[proc.pid]) as session:
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        events = list(session.events(duration=20))
    proc.wait(timeout=10)
    assert [e.arg("a") for e in events] == list(range(7))
    assert {e.pid for e in events} == {proc.pid}


def test_two_sessions_side_by_side(loop: Path) -> None:
    first = Session([f"{loop}:func_1 a=arg1:s32"], engine="tracefs", command=[str(loop), "4"])
    second = Session([f"{loop}:func_1 a=arg1:s32"], engine="tracefs", command=[str(loop), "3"])
    with first, second:
        events_second = list(second.events(duration=20))
        events_first = list(first.events(duration=20))
    assert [e.arg("a") for e in events_first] == [0, 1, 2, 3]
    assert [e.arg("a") for e in events_second] == [0, 1, 2]
    assert {e.pid for e in events_first}.isdisjoint({e.pid for e in events_second})


def test_count_limit_and_detach_leave_command_running_untraced(loop: Path) -> None:
    session = Session([f"{loop}:func_1"], engine="tracefs", command=[str(loop), "5"])
    with session:
        events = list(session.events(count=2))
    assert len(events) == 2


def test_kernel_refusal_names_the_probe_and_installs_nothing(loop: Path, tmp_path: Path) -> None:
    # An offset past the end of a file is accepted when defined and refused when enabled.
    small = tmp_path / "small.bin"
    small.write_bytes(Path(loop).read_bytes()[:4096])
    from probescope.language.kernel_grammar import parse_kernel_probe
    from probescope.language.resolved import ResolvedProbe

    spec = parse_kernel_probe(f"p:bad {small}:0x100000")
    probe = ResolvedProbe.from_uprobe_spec(spec)  # type: ignore[arg-type]
    session = Session(probes=[probe], engine="tracefs", command=[str(loop), "1"])
    with pytest.raises(TracefsError, match="refused to arm"):
        session.start()
    session.close()


def test_sink_exception_still_tears_down(loop: Path) -> None:
    session = Session([f"{loop}:func_1"], engine="tracefs", command=[str(loop), "5"])
    with pytest.raises(RuntimeError), session:
        for _ in session.events():
            raise RuntimeError("sink failed")


def test_spec_errors_touch_nothing(loop: Path) -> None:
    before = Path("/sys/kernel/tracing/uprobe_events").read_text()
    with pytest.raises(ProbescopeError):
        Session([f"{loop}:func_1 %rax", f"{loop}:no_such_function"], engine="tracefs")
    assert Path("/sys/kernel/tracing/uprobe_events").read_text() == before


def test_command_not_found_is_clear() -> None:
    session = Session(["c:malloc"], engine="tracefs", command=["/nonexistent/prog"])
    with pytest.raises(ProbescopeError, match="cannot run"):
        session.start()
    session.close()
    assert os.path.exists("/sys/kernel/tracing/uprobe_events")
