"""Kernel tracepoints through the tracefs engine, alone and in one timeline with uprobes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probescope.engines.tracefs.instance import Instance
from probescope.errors import SpecError, SpecErrors, TracefsError
from probescope.language.model import ProbeKind
from probescope.session import Session
from support.witness import record_both, renamed_as_kernel, same_but_time

pytestmark = pytest.mark.root


def test_exec_and_exit_of_the_command(loop: Path) -> None:
    session = Session(
        ["t:sched:sched_process_exec", "t:sched:sched_process_exit"],
        engine="tracefs",
        command=[str(loop), "2"],
    )
    with session:
        events = list(session.events(duration=20))
    by_name = {e.name: e for e in events}
    exec_event = by_name["sched_process_exec"]
    assert exec_event.kind is ProbeKind.TRACEPOINT
    assert exec_event.group == "sched"
    assert exec_event.arg("filename") == str(loop)
    assert exec_event.arg("pid") == exec_event.pid
    exit_event = by_name["sched_process_exit"]
    assert exit_event.arg("pid") == exec_event.pid
    assert exit_event.arg("comm") == "loop"


def test_filter_and_one_timeline_with_uprobes(loop: Path) -> None:
    specs = [
        f"{loop}:func_1 a=arg1:s32",
        "t:sched:sched_process_exit if prio >= 0",
        "t:sched:sched_process_exec",
    ]
    session = Session(specs, engine="tracefs", command=[str(loop), "3"])
    with session:
        events = list(session.events(duration=20))
    names = [e.name for e in events]
    assert names[0] == "sched_process_exec"
    assert names[1:4] == ["func_1"] * 3
    assert names[-1] == "sched_process_exit"
    stamps = [e.timestamp_ns for e in events]
    assert stamps == sorted(stamps)
    kinds = {e.kind for e in events}
    assert kinds == {ProbeKind.TRACEPOINT, ProbeKind.UPROBE}


def test_filter_rejects_everything_it_should(loop: Path) -> None:
    session = Session(
        ["t:sched:sched_process_exit if pid == 1"], engine="tracefs", command=[str(loop), "1"]
    )
    with session:
        events = list(session.events(duration=20))
    assert events == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("t:sched:sched_switch if prev_pidd > 0", "no field 'prev_pidd'"),
        ("t:sched:sched_switch if prev_comm > 5", "string field"),
        ('t:sched:sched_switch if prev_pid == "x"', "compared with a string"),
        ("t:sched:sched_switch if prev_pid", "expected a comparison"),
        ("t:sched:nosuch", "no tracepoint sched:nosuch"),
        ("t:nosuch:*", "no tracepoint system"),
    ],
)
def test_bad_tracepoints_and_filters_enable_nothing(spec: str, message: str) -> None:
    instances = set(os.listdir("/sys/kernel/tracing/instances"))
    session = Session([spec], engine="tracefs", command=["true"])
    with pytest.raises((SpecError, SpecErrors), match=message) as info:
        session.start()
    session.close()
    assert isinstance(info.value, SpecError) and info.value.column is not None
    assert set(os.listdir("/sys/kernel/tracing/instances")) == instances


def test_kernel_refusal_of_a_filter_shows_its_reason(loop: Path) -> None:
    # Passes our field check, refused by the kernel's parser: a glob on a number field.
    session = Session(
        ["t:sched:sched_process_exit if (pid == 1"], engine="tracefs", command=[str(loop), "1"]
    )
    with pytest.raises(TracefsError, match="refused the filter"):
        session.start()
    session.close()


def test_glob_selects_several_events() -> None:
    session = Session(["t:sched:sched_process_*"], engine="tracefs", command=["true"])
    with session:
        names = {e.name for e in session.events(duration=20)}
    assert {"sched_process_exec", "sched_process_exit"} <= names


def test_function_tracer_refusal_says_which_file() -> None:
    session = Session(["f:vfs_read"], engine="tracefs", command=["true"])
    try:
        session.start()
    except TracefsError as error:
        assert "available_filter_functions" in error.message or "current_tracer" in error.message
    else:
        pytest.skip("this kernel allows the function tracer (covered by the VM tests)")
    finally:
        session.close()


def test_tracepoint_text_equals_kernel_trace(loop: Path) -> None:
    """Tracepoint lines printed from each event's `print fmt` are the kernel's lines."""
    specs = [
        "t:sched:sched_process_exec",
        "t:sched:sched_process_fork",
        "t:sched:sched_process_exit",
        "t:sched:sched_process_free",
        "t:signal:signal_generate",
        "t:signal:signal_deliver",
        "t:task:task_rename",
    ]
    script = f"read line; {loop} 2 >/dev/null; sleep 0.01 & kill -USR1 $$ 2>/dev/null; wait"

    def arm(witness: Instance, engine: object) -> None:
        for spec in specs:
            witness.enable_event(*spec.split(":")[1:])

    ours, expected = record_both(specs, ["sh", "-c", f"trap : USR1; {script}"], arm, serial=97)
    assert len(ours) >= 6
    assert {line.split(": ", 2)[1].split(":")[0] for line in ours} >= {
        "sched_process_exec",
        "sched_process_fork",
        "sched_process_exit",
    }
    assert same_but_time(renamed_as_kernel(ours, expected)) == same_but_time(expected)


def test_syscall_tracepoints_record_known_activity(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A child calls getpid, nanosleep and write(13 bytes): the syscall tracepoints carry
    exactly those values, and their text is what the kernel prints for them."""
    import io
    import re

    from support.build import compile_program

    if not Path("/sys/kernel/tracing/events/syscalls").is_dir():
        pytest.skip("this kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)")
    source = (Path(__file__).parents[2] / "targets" / "syscalls.c").read_text()
    program = compile_program(source, "syscalls", ("-O1",))
    target = tmp_path / "written.txt"
    specs = [
        "t:syscalls:sys_enter_getpid",
        "t:syscalls:sys_enter_nanosleep",
        "t:syscalls:sys_enter_write if count == 13",
        "t:syscalls:sys_exit_write",
    ]
    session = Session(specs, engine="tracefs", command=[str(program), str(target)])
    with session:
        events = list(session.events(duration=30))
    printed = capfd.readouterr().out
    match = re.search(r"pid (\d+) fd (\d+) wrote (\d+)", printed)
    assert match is not None, printed
    pid, fd, wrote = map(int, match.groups())
    by_name: dict[str, list[object]] = {}
    for event in events:
        by_name.setdefault(event.name, []).append(event)
    assert len(by_name["sys_enter_getpid"]) >= 1
    (write,) = by_name["sys_enter_write"]
    assert write.pid == pid  # type: ignore[attr-defined]
    assert (write.arg("fd"), write.arg("count")) == (fd, 13)  # type: ignore[attr-defined]
    assert any(e.arg("ret") == wrote for e in by_name["sys_exit_write"])  # type: ignore[attr-defined]
    out = io.StringIO()
    from probescope.sinks.base import open_sink

    sink = open_sink("text", out, context=session.kernel_context())
    sink.write(write)  # type: ignore[arg-type]
    assert (
        out.getvalue()
        .rstrip()
        .endswith(
            f"sys_write(fd: {fd}, buf: ",
        )
        or "sys_write(" in out.getvalue()
    )
    assert target.read_text() == "probescope!!\n"


def test_the_engine_gives_the_formats_of_its_events(loop: Path) -> None:
    """The per-session facts a KernelContext needs to decode this session's records elsewhere:
    the formats the engine read from its instance, which the events also carry."""
    from probescope.engines.tracefs.engine import TracefsEngine
    from probescope.traceevent.decoder import EventDecoder

    session = Session(
        [f"{loop}:func_1 a=arg1:s32", "t:sched:sched_process_exec"],
        engine="tracefs",
        command=[str(loop), "1"],
    )
    with session:
        engine = session.engine
        assert isinstance(engine, TracefsEngine) and engine.group is not None
        formats = engine.event_formats()
        events = list(session.events(duration=20))
    assert {f.label for f in formats} == {f"{engine.group}/func_1", "sched/sched_process_exec"}
    exec_event = next(e for e in events if e.name == "sched_process_exec")
    assert exec_event.type.format in formats
    context = session.kernel_context().with_formats(formats)
    offline = EventDecoder.from_context(context).event_types
    by_name = {event_type.name: event_type for event_type in offline.values()}
    assert by_name["func_1"].arg_names == ("a",)
    assert by_name["sched_process_exec"].arg_names == exec_event.type.arg_names
