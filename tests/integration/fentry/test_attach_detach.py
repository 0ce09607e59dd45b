"""Attaching to a running multi-threaded program and detaching from it: events with the right
values, and afterwards every byte of text as in the file, no code area left, the program's
output and exit status untouched — also over many patch/unpatch rounds."""

from __future__ import annotations

import time

import pytest

from probescope.engines.base import Target
from probescope.engines.fentry.engine import FentryEngine
from probescope.events import EventBatch
from probescope.session import Session
from support.processes import text_differences

from .harness import (
    hammer,
    hammer_specs,
    libc_path,
    our_areas,
    requires_fentry,
    start,
)

pytestmark = [pytest.mark.root, requires_fentry]


def test_attach_record_and_detach_leave_the_program_as_it_was() -> None:
    path = hammer()
    program = start([path, "stdin"])
    session = Session(hammer_specs(path), engine="fentry", pids=[program.pid])
    events = []
    with session:
        for batch in session.batches(duration=0.5):
            events += batch.events
    assert text_differences(program.pid, path) == []
    assert text_differences(program.pid, libc_path(program.pid)) == []
    assert our_areas(program.pid) == []
    out, _ = program.communicate(timeout=60)
    assert (out, program.returncode) == ("good 4\n", 0)
    mixes = [e for e in events if e.name == "mix"]
    returns = [e for e in events if e.name == "mix__return"]
    assert mixes and returns
    for event in mixes[:1000]:
        assert event.pid == program.pid
    a, b = mixes[0].args
    assert a >= 0 and b >= 0
    for event in returns[:1000]:
        assert 0 <= event.args[0] < 1000003
        assert event.ret_ip is not None
    assert 1 <= len({e.tid for e in events}) <= 4  # the worker threads


@pytest.mark.slow
def test_many_patch_and_unpatch_rounds_under_four_threads() -> None:
    path = hammer()
    rounds = 25
    program = start([path, "stdin"])
    try:
        for _ in range(rounds):
            engine = FentryEngine()
            engine.attach(Session(hammer_specs(path)).probes, Target(pids=(program.pid,)))
            deadline = time.monotonic() + 0.05
            for item in engine.events():
                assert isinstance(item, EventBatch)
                if time.monotonic() > deadline:
                    break
            engine.detach()
            assert program.poll() is None
            assert text_differences(program.pid, path) == []
            assert our_areas(program.pid) == []
            assert engine.stats().extra["restored_sites"] >= 1
    except BaseException:
        program.kill()
        raise
    out, _ = program.communicate(timeout=60)
    assert (out, program.returncode) == ("good 4\n", 0)
