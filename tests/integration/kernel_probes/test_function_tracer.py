"""The ftrace function tracer in a private instance: filters, pid filtering, `func <-parent`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from probescope.engines.tracefs.instance import Instance
from probescope.errors import SpecError
from probescope.language.model import ProbeKind
from probescope.session import Session
from probescope.sinks.base import open_sink
from support.cli import probescope
from support.witness import record_both, same_but_time

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
    sink = open_sink("text", out, context=session.kernel_context())
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


def test_notrace_patterns_are_excluded(opened_file: Path) -> None:
    session = Session(
        ["f:vfs_*", "f:!vfs_read", "f:!vfs_open"],
        engine="tracefs",
        command=["cat", str(opened_file)],
    )
    with session:
        names = {e.args[0] for e in session.events(duration=60)}
    context = session.kernel_context()
    functions = {context.print_symbol(ip, offset=False) for ip in names}
    assert functions, "other vfs_ functions were traced"
    assert "vfs_read" not in functions and "vfs_open" not in functions
    assert all(name.startswith("vfs_") for name in functions)


def test_only_exclusions_need_all() -> None:
    session = Session(["f:!vfs_read"], engine="tracefs", command=["true"])
    with pytest.raises(SpecError, match="only excluded"):
        session.start()
    session.close()


def test_stack_traces_print_like_the_kernel(opened_file: Path) -> None:
    def arm(witness: Instance, engine: object) -> None:
        witness.write("set_ftrace_filter", "vfs_read")
        witness.set_option("function-fork", True)
        witness.write("set_ftrace_pid", witness.read("set_event_pid").strip())
        witness.set_option("func_stack_trace", True)
        witness.write("current_tracer", "function")

    # No exec in a traced process: the kernel prints every line with the comm a task has when
    # `trace` is read, probescope with the comm it had when the event was decoded.
    ours, expected = record_both(
        ["f:vfs_read"],
        ["sh", "-c", f"read line; cat {opened_file} >/dev/null"],
        arm,
        serial=96,
        function_stack=True,
    )
    assert any(line.endswith("<stack trace>") for line in ours)
    assert any(line.startswith(" => ") for line in ours)
    assert same_but_time(ours) == same_but_time(expected)


def test_kernel_stacks_of_a_recording(opened_file: Path, tmp_path: Path) -> None:
    """`record --stack` keeps the kernel stack after every function event; `stacks --input`
    names its frames from the recording's kallsyms, one stack per event, and `count --by
    kstack` agrees."""
    out = tmp_path / "kstacks.dat"
    probescope("record", "-q", "--stack", "-o", str(out), "-c", f"cat {opened_file}", "f:vfs_read")
    reads = probescope("count", "-q", "--input", str(out)).stdout  # ftrace's `function` events
    (hits,) = (int(n) for n in re.findall(r"@count\[function\]: (\d+)", reads))
    assert hits > 0
    document = json.loads(
        probescope(
            "stacks", "-q", "--input", str(out), "--by", "kstack", "-f", "json"
        ).stdout.splitlines()[0]
    )
    stacks = {tuple(key.split()): n for key, n in document["data"]["@stacks"].items()}
    assert sum(stacks.values()) == hits
    for frames in stacks:
        # the top frame may be ftrace's trampoline (not in kallsyms: the kernel prints its
        # address too); below it, named kernel functions down to the system call entry
        assert any(frame.startswith("vfs_read+") for frame in frames[:2]), frames
        assert any(frame.startswith("do_syscall_64+") for frame in frames), frames
        assert not any(frame.startswith("0x") for frame in frames[1:]), frames
    counted = probescope("count", "-q", "--input", str(out), "--by", "kstack", "-f", "json")
    by_key = json.loads(counted.stdout.splitlines()[0])["data"]["@count"]
    assert sorted(by_key.values()) == sorted(stacks.values())
