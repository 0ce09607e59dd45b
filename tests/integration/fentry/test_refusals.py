"""Probes the fentry engine refuses — a loop head or a jump table in a function's first bytes,
memory-reading arguments, instructions inside functions — are named with the reason and run on
another engine instead; those functions are never patched. A process under seccomp is refused
as a whole."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

from probescope.engines.base import Target
from probescope.engines.fentry.engine import FentryEngine
from probescope.errors import ProbescopeError
from probescope.session import Session
from support.build import compile_program
from unit.fentry.shapes import SHAPES

from .harness import TARGETS, requires_fentry, start, target

pytestmark = [pytest.mark.root, requires_fentry]


def shapes_program() -> str:
    source = (TARGETS / "fentry" / "shapes_main.c").read_text() + SHAPES
    return str(compile_program(source, "shapes_main", ("-O1",)))


def test_refusals_name_the_probe_and_the_reason() -> None:
    path = shapes_program()
    probes = Session(
        [
            f"{path}:loop_head",
            f"{path}:jump_table",
            f"{path}:riprel",
            f"{path}:with_endbr x=+0(%sp):u64",
            f"{path}:flags_own+2",
        ]
    ).probes
    refusals = {probe.symbol: reason for probe, reason in FentryEngine().refusals(probes).items()}
    assert "a loop head" in refusals["loop_head"]
    assert "may be a jump table" in refusals["jump_table"]
    assert "reads memory" in refusals["with_endbr"]
    assert "patches function entries only" in refusals["flags_own"]
    assert "riprel" not in refusals


def test_refused_probes_run_on_the_kernel_beside_fentry() -> None:
    path = shapes_program()
    specs = [
        f"{path}:loop_head",
        f"{path}:riprel",
        f"r:{path}:tiny_padded r=$retval:s32",
        f"{path}:with_endbr x=arg1:s32",
        f"{path}:back_to_entry n=arg1:s32",
        f"{path}:flags_own s=+0(%sp):x64",
    ]
    norandom = str(compile_program((TARGETS / "norandom.c").read_text(), "norandom", ("-O1",)))
    status = subprocess.run([path]).returncode
    counts = {}
    for engine in ("fentry", "tracefs"):  # address randomization off: the same addresses
        session = Session(specs, engine=engine, command=[norandom, path])
        with session:
            events = list(session.events(duration=30))
        stats = session.summary().stats
        assert stats is not None and stats.command_status == status
        counts[engine] = Counter((e.name, e.ip, e.args) for e in events if e.name != "flags_own")
        if engine == "fentry":
            assert stats.extra["fallback_probes"] == 2
            notes = "\n".join(stats.notes)
            assert "loop_head runs on the tracefs engine" in notes
            assert "flags_own runs on the tracefs engine" in notes
    assert counts["fentry"] == counts["tracefs"]
    assert {name for name, _, _ in counts["fentry"]} == {
        "loop_head", "riprel", "tiny_padded__return", "with_endbr", "back_to_entry",
    }  # fmt: skip


def test_a_process_under_seccomp_is_refused_whole() -> None:
    path = target("seccomp.c", ("-O0", "-g"))
    program = start([path])
    try:
        engine = FentryEngine()
        with pytest.raises(ProbescopeError, match="seccomp"):
            engine.attach(Session([f"{path}:work"]).probes, Target(pids=(program.pid,)))
        # --engine fentry falls back to the kernel's uprobes for the whole process
        session = Session([f"{path}:work x=arg1:s32"], engine="fentry", pids=[program.pid])
        with session:
            program.stdin.write("abc")  # type: ignore[union-attr]
            program.stdin.close()  # type: ignore[union-attr]
            events = list(session.events(duration=20))
        stats = session.summary().stats
        assert stats is not None
        assert any("under seccomp" in note for note in stats.notes)
        assert [e.args for e in events] == [(0,), (1,), (3,)]
    finally:
        if program.poll() is None:
            program.kill()
        program.wait(timeout=30)
    assert program.returncode == 0
