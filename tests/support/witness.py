"""A witness instance: the same events recorded a second time in a tracefs instance of the
test's own, whose `trace` file (the kernel's own printer) the text sink is compared with."""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from probescope.engines.base import EngineOptions
from probescope.engines.tracefs.engine import TracefsEngine
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.ownership import Owner
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.session import Session
from probescope.sinks.base import open_sink
from probescope.system.kernel import RunningKernel

_TIMESTAMP = re.compile(r"(?<= )\d+\.\d{6}(?=: )")
_NEED_RESCHED = re.compile(r"(?<=\] )(.)[.NnpBLbl](?=\S{3} )")
_UNDERFLOWED_CONTEXT = re.compile(r"(?<=\] ).(.).(?=ff )")


def same_but_time(lines: list[str]) -> list[str]:
    """Each instance records its own copy of an event a moment apart: keep the timestamp's
    shape (width, precision) but not its digits, and drop the need-resched flag, which a
    timer tick may set between the two copies (the flag printer itself is checked exactly
    against captured pages in tests/unit/tracefs). Where the preempt columns read `ff`, the
    kernel computed the context of that copy from an underflowed preempt count (6.18's
    uprobes), and the irqs-off and irq-context flags of the two copies can differ as well."""
    return [
        _UNDERFLOWED_CONTEXT.sub(
            r"?\1?",
            _NEED_RESCHED.sub(
                r"\1?", _TIMESTAMP.sub(lambda m: re.sub(r"\d", "9", m.group()), line)
            ),
        )
        for line in lines
    ]


def unknown_comms_as_kernel(ours: list[str], kernel: list[str]) -> list[str]:
    """Where the kernel printed `<...>` (its saved_cmdlines, 128 entries by default, had
    already forgotten the task when `trace` was read), print ours the same way: probescope
    named the task while it still could."""
    head = re.compile(r"^\s*(.*)-(\d+)\s+\[")
    forgotten = set()
    for line in kernel:
        match = head.match(line)
        if match and match.group(1) == "<...>":
            forgotten.add(match.group(2))
    result = []
    for line in ours:
        match = head.match(line)
        if match and match.group(2) in forgotten and match.group(1) != "<...>":
            line = f"{'<...>':>16}-{match.group(2)}" + line[match.end(2) :]
        result.append(line)
    return result


def renamed_as_kernel(ours: list[str], kernel: list[str]) -> list[str]:
    """Where a task renamed itself (exec, prctl: a `task_rename` line says so) and the kernel
    printed its later name on a line where ours has the earlier one, print ours the kernel's
    way: the kernel names tasks when `trace` is read, probescope when it decodes."""
    head = re.compile(r"^\s*(.*)-(\d+)\s+\[")
    rename = re.compile(r"task_rename: pid=(\d+) oldcomm=(.*) newcomm=(.*) oom_score_adj")
    names: dict[str, set[str]] = {}
    for line in ours + kernel:
        match = rename.search(line)
        if match:
            names.setdefault(match.group(1), set()).update(match.group(2, 3))
    result = []
    for line, theirs in zip(ours, kernel, strict=False):
        mine, other = head.match(line), head.match(theirs)
        if (
            mine
            and other
            and mine.group(2) == other.group(2)
            and mine.group(1) != other.group(1)
            and {mine.group(1), other.group(1)} <= names.get(mine.group(2), set())
        ):
            line = theirs[: other.end(2)] + line[mine.end(2) :]
        result.append(line)
    return result + ours[len(result) :]


def trace_lines(instance: Instance) -> list[str]:
    """The event lines of an instance's `trace` file (the header comments left out)."""
    return [
        line for line in instance.read("trace").splitlines() if line and not line.startswith("#")
    ]


@contextmanager
def witness(
    serial: int, *, clock: str = "mono", pids: list[int] | None = None
) -> Iterator[Instance]:
    """A private instance named after this process (reaped like a session's if the test dies),
    removed on the way out."""
    instance = Instance.create(Tracefs.discover(), Owner.current().instance_name(serial))
    try:
        instance.set_clock(clock)
        if instance.exists("options/hash-ptr") and RunningKernel.read().grammar.release >= (6, 2):
            # Real pointers for %p, as probescope prints them. Not on 6.1: there `hash-ptr` off
            # makes `trace` print every %s of a print fmt as an empty string.
            instance.set_option("hash-ptr", False)
        if pids:
            instance.set_event_pids(pids)
        yield instance
    finally:
        instance.remove()


def record_both(
    specs: list[str],
    argv: list[str],
    arm_witness: Callable[[Instance, TracefsEngine], None],
    *,
    serial: int,
    clock: str = "mono",
    function_stack: bool = False,
    user_stack: bool = False,
) -> tuple[list[str], list[str]]:
    """Run `argv` (it must wait for a line on stdin before doing its work) under a session of
    `specs` and, armed by `arm_witness`, a witness instance; return (our text lines, the
    kernel's lines from the witness's `trace`)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert proc.stdin is not None
    options = EngineOptions(clock=clock, function_stack=function_stack, user_stack=user_stack)
    session = Session(specs, engine="tracefs", pids=[proc.pid], options=options)
    out = io.BytesIO()
    sink = open_sink("text", out, context=session.kernel_context())
    try:
        session.start()
        engine = session.engine
        assert isinstance(engine, TracefsEngine) and engine.group is not None
        with witness(serial, clock=clock, pids=[proc.pid]) as instance:
            arm_witness(instance, engine)
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            for batch in session.batches(duration=60):
                sink.write_batch(batch)
            expected = trace_lines(instance)
    finally:
        session.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    ours = out.getvalue().decode("utf-8", "surrogateescape").splitlines()
    return unknown_comms_as_kernel(ours, expected), expected
