"""In-program filters against the kernel's own: each expression is set, by hand, as the
`filter` of a uprobe event in a private tracefs instance (the kernel's event filter is the
oracle), and compiled into the bpf engine's program; both must let the same hits through.
Also: filtered-out hits never reach user space, and filters on tracepoints."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from integration.bpf.harness import trace
from probescope.engines.tracefs.ownership import Owner
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import SpecError
from probescope.language.model import ProbeSpec
from probescope.session import Session
from probescope.symbols.resolve import resolve_specs
from support.tracefs import append, tracefs_root
from support.witness import trace_lines, witness

pytestmark = pytest.mark.root

EXPRESSIONS = [
    "number > 0",
    "number >= -1 && number < 2",
    'number == -3 || word == "delta"',
    "!(number & 1)",
    "number & 0x2",
    'word ~ "alpha*"',
    'word ~ "*ta"',
    'word ~ "*et*"',
    'word ~ "*"',
    'word != "beta"',
    'word == ""',
    'word == "alphabe"',
    'comm == "values" && number <= 0',
    'comm ~ "val*"',
    "common_pid > 0 && (number < -2 || number > 2)",
]
ARGS = "number=%di:s32 word=+0(%si):string"


def kernel_passes(values: Path, offset: int, argv: list[str]) -> list[list[int]]:
    """The `number` of each hit each expression lets through, as the kernel's filters do."""
    group = Owner.current().group_name(900)
    root = tracefs_root()
    assert root is not None
    names = [f"f{i}" for i in range(len(EXPRESSIONS))]
    append(
        root / "uprobe_events",
        "".join(f"p:{group}/{name} {values}:{offset:#x} {ARGS}\n" for name in names),
    )
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        with witness(900, pids=[proc.pid]) as instance:
            for name, expression in zip(names, EXPRESSIONS, strict=True):
                instance.set_filter(group, name, expression)
            instance.enable_group(group)
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
            lines = trace_lines(instance)
            instance.enable_group(group, on=False)
    finally:
        tracefs = Tracefs(root)
        for name in names:
            tracefs.append("uprobe_events", f"-:{group}/{name}\n")
    passed: list[list[int]] = [[] for _ in EXPRESSIONS]
    for line in lines:
        name = line.split(": ", 2)[1]
        number = int(line.split("number=")[1].split()[0])
        passed[names.index(name)].append(number)
    return passed


def test_filters_pass_what_the_kernels_pass(values: Path, no_aslr: Path) -> None:
    (probe,) = resolve_specs([f"{values}:filter_probe {ARGS}"])
    assert probe.offset is not None
    # the program waits for its stdin to close before it runs (the witness is armed by then)
    gate = ["sh", "-c", f'read line; exec "{no_aslr}" "{values}"']
    expected = kernel_passes(values, probe.offset, gate)
    assert expected[0] == [1, 2, 3] and expected[5] == [-3, 1]  # the oracle works
    for expression, wanted in zip(EXPRESSIONS, expected, strict=True):
        spec = probe.spec
        assert isinstance(spec, ProbeSpec)
        filtered = replace(probe, spec=replace(spec, filter=expression))
        session = Session(engine="bpf", probes=[filtered], command=[str(no_aslr), str(values)])
        with session:
            numbers = [event.arg("number") for event in session.events(duration=60)]
        assert numbers == wanted, expression
        stats = session.summary().stats
        assert stats is not None
        assert stats.extra.get("filtered", 0) == 7 - len(wanted), expression


def test_default_filter_applies_to_uprobes_and_tracepoints(values: Path) -> None:
    from probescope.engines.base import EngineOptions

    events, _ = trace(
        "bpf",
        [f"{values}:filter_probe {ARGS}", "t:sched:sched_process_exit"],
        [str(values)],
        options=EngineOptions(default_filter='comm == "values"'),
    )
    names = [event.name for event in events]
    assert names.count("filter_probe") == 7 and names.count("sched_process_exit") == 1


def test_tracepoint_filter_in_the_program(values: Path) -> None:
    events, summary = trace(
        "bpf",
        ['t:sched:sched_process_exit if prio >= 0 && comm ~ "*lue*"', "t:sched:sched_process_exec"],
        [str(values)],
    )
    assert [event.name for event in events] == ["sched_process_exec", "sched_process_exit"]
    exiting = events[1]
    assert exiting.arg("comm") == "values" and exiting.arg("pid") == exiting.tid
    none, _ = trace("bpf", ["t:sched:sched_process_exit if prio < 0"], [str(values)])
    assert none == []
    assert summary.lost == 0


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("nosuch == 1", "no field 'nosuch'"),
        ('word ~ "a*b"', "globs of the forms"),
        ("word > 1", "compares with ==, != or ~"),
    ],
)
def test_bad_filters_are_refused_before_anything_is_attached(
    values: Path, expression: str, message: str
) -> None:
    from probescope.engines.base import EngineOptions

    session = Session(
        [f"{values}:filter_probe {ARGS}"],
        engine="bpf",
        command=[str(values)],
        options=EngineOptions(default_filter=expression),
    )
    with pytest.raises(SpecError, match=message):
        session.start()


def test_a_probes_own_if_filters_in_the_program(values: Path) -> None:
    """`TARGET:SYMBOL ARGS if EXPR`: the language carries the filter on the spec; the bpf
    engine compiles it (as it does --filter), and the tracefs and ptrace engines give the same
    events (the kernel's filter file, a Python evaluation)."""
    from probescope.engines.base import EngineOptions

    spec = f'{values}:filter_probe {ARGS} if number > 0 || word == "delta"'
    events, summary = trace("bpf", [spec], [str(values)])
    by_filter, _ = trace(
        "bpf",
        [f"{values}:filter_probe {ARGS}"],
        [str(values)],
        options=EngineOptions(default_filter='number > 0 || word == "delta"'),
    )
    assert [e.args for e in events] == [e.args for e in by_filter]
    assert [e.arg("number") for e in events] == [0, 1, 2, 3]  # 0: "delta"
    assert summary.stats is not None and summary.stats.extra["filtered"] == 3
    for engine in ("auto", "tracefs", "ptrace"):
        other, _ = trace(engine, [spec], [str(values)])
        assert [e.args for e in other] == [e.args for e in events], engine


def test_a_filter_naming_no_argument_is_refused_with_a_caret(values: Path) -> None:
    spec = f"{values}:filter_probe {ARGS} if numbr > 0"
    session = Session([spec], engine="bpf", command=[str(values)])
    with pytest.raises(SpecError, match="no field 'numbr'") as caught:
        session.start()
    session.close()
    assert caught.value.column == spec.index("numbr")
