"""Frames left without returning — longjmp, C++ exceptions — must not break the program; their
pending return probes are dropped (the kernel's alive test), later ones still fire."""

from __future__ import annotations

from integration.ptrace.harness import assert_same_behaviour, make_probe, run_plain, run_traced


def test_longjmp_out_of_hijacked_frames(target):
    path = target("longjmp.c")
    probes = [
        make_probe(path, "leaf", "n=%di:s32", event="leaf_entry"),
        make_probe(path, "leaf", "r=$retval:s32", kind="r", event="leaf_return"),
        make_probe(path, "middle", "r=$retval:s32", kind="r", event="middle_return"),
    ]
    run = run_traced(probes, [path])
    assert_same_behaviour(run, run_plain([path]))
    assert [e.arg("n") for e in run.named("leaf_entry")] == [0, 1, 2, 3, 4, 5]
    # leaf(3) and middle(3) never return: no return events for them, and no stale entries
    # confusing the later calls.
    assert [e.arg("r") for e in run.named("leaf_return")] == [0, 1, 2, 4, 5]
    assert [e.arg("r") for e in run.named("middle_return")] == [1, 2, 3, 5, 6]
    sequence = [(e.name, e.args[0]) for e in run.events]
    assert sequence[-3:] == [("leaf_entry", 5), ("leaf_return", 5), ("middle_return", 6)]


def test_cxx_exceptions_through_hijacked_frames(target):
    path = target("exceptions.cc")
    probes = [
        make_probe(path, "_Z7throweri", "n=%di:s32", event="thrower_entry"),
        make_probe(path, "_Z7throweri", "r=$retval:s32", kind="r", event="thrower_return"),
        make_probe(path, "_Z7wrapperi", "r=$retval:s32", kind="r", event="wrapper_return"),
        make_probe(path, "_Z5outeri", "r=$retval:s32", kind="r", event="outer_return"),
    ]
    run = run_traced(probes, [path])
    assert_same_behaviour(run, run_plain([path]))
    assert [e.arg("n") for e in run.named("thrower_entry")] == [0, 1, 2, 3, 4, 5, 6, 3]
    # thrower(0), (3), (6) throw: their frames and wrapper's are unwound without a return.
    assert [e.arg("r") for e in run.named("thrower_return")] == [1, 2, 4, 5]
    assert [e.arg("r") for e in run.named("wrapper_return")] == [2, 4, 8, 10]
    # outer catches and returns normally every time.
    assert [e.arg("r") for e in run.named("outer_return")] == [-1, 2, 4, -1, 8, 10, -1]
