"""The ftrace function tracer in a private instance: filters, pid filtering, `func <-parent`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from probescope.errors import SpecError
from probescope.session import Session
from probescope.sinks.base import open_sink
from probescope.spec.model import ProbeKind

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("function_tracer")]


def test_function_events_of_the_command_only(opened_file: Path) -> None:
    session = Session(
        ["f:vfs_read", "f:vfs_open"], engine="tracefs", command=["cat", str(opened_file)]
    )
    with session:
        events = list(session.events(duration=60))
    assert events
    assert all(e.kind is ProbeKind.FUNCTION for e in events)
    pids = {e.pid for e in events}
    assert len(pids) == 1, "only the command (set_ftrace_pid) is traced"
    import io

    out = io.StringIO()
    sink = open_sink("text", out)
    for event in events:
        sink.write(event)
    lines = out.getvalue().splitlines()
    assert any(re.search(r": vfs_read <-\S+$", line) for line in lines), lines[:5]
    assert any(re.search(r": vfs_open <-\S+$", line) for line in lines), lines[:5]
    assert all(line.split("-")[0].strip() == "cat" for line in lines)


def test_everything_is_refused_without_all() -> None:
    session = Session(["f:*"], engine="tracefs", command=["true"])
    with pytest.raises(SpecError, match="traces all"):
        session.start()
    session.close()


def test_no_match_is_refused() -> None:
    session = Session(["f:probescope_no_such_fn*"], engine="tracefs", command=["true"])
    with pytest.raises(SpecError, match="no kernel function matches"):
        session.start()
    session.close()


def test_module_pattern_and_timeline_with_tracepoints(opened_file: Path) -> None:
    session = Session(
        ["f:vfs_read", "t:sched:sched_process_exec"],
        engine="tracefs",
        command=["cat", str(opened_file)],
    )
    with session:
        events = list(session.events(duration=60))
    kinds = [e.kind for e in events]
    assert kinds[0] is ProbeKind.TRACEPOINT
    assert ProbeKind.FUNCTION in kinds
    stamps = [e.timestamp_ns for e in events]
    assert stamps == sorted(stamps)
