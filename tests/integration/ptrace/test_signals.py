"""Signals meant for the program reach it unchanged: handlers (that call probed code), its own
SIGTRAPs, faults in displaced instructions (reported at the original address), and job-control
stops of a traced child."""

from __future__ import annotations

import pytest

from integration.ptrace.harness import assert_same_behaviour, make_probe, run_plain, run_traced
from probescope.engines.ptrace import PtraceEngine


@pytest.mark.parametrize("mode", [{}, {"emulate": False}, {"single_step": True}])
def test_signals_are_delivered_unchanged(target, mode):
    path = target("signals.c")
    work = make_probe(path, "work", "x=%di:s32")
    fault = make_probe(path, "site_fault", "p=%di", function="load_from")
    run = run_traced([work, fault], [path], engine=PtraceEngine(**mode))
    assert_same_behaviour(run, run_plain([path]))
    assert b"fault at site: yes" in run.stdout
    xs = [e.arg("x") for e in run.named("work")]
    # main calls work(i), the SIGUSR1 handler calls work(10); the child calls work(100).
    assert xs == [0, 10, 1, 10, 2, 10, 3, 10, 4, 10, 100]
    assert [e.arg("p") for e in run.named("site_fault")][-1] == 0
