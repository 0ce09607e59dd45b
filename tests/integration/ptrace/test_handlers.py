"""Python handlers run while the thread is stopped: they read and write registers and memory,
and can change what a function returns (the fault-injection example of docs/ptrace-engine.md)."""

from __future__ import annotations

import pytest

from integration.ptrace.harness import LIBC, make_probe, run_plain, run_traced
from probescope.engines.ptrace import HitContext


def test_malloc_returns_null_on_the_third_call(target):
    """The worked example from docs/ptrace-engine.md, verbatim in spirit."""
    path = target("malloc.c")
    malloc = make_probe(LIBC, "malloc", "size=%di:u64")
    calls = 0

    def fail_third_malloc(ctx: HitContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            ctx.override_return(0)  # skip malloc, return NULL to the caller

    run = run_traced([malloc], [path], handlers=[(malloc, fail_third_malloc)])
    assert run.stdout.decode().splitlines() == [
        "malloc #1 (1000 bytes): ok",
        "malloc #2 (2000 bytes): ok",
        "malloc #3 (3000 bytes): NULL",
        "malloc #4 (4000 bytes): ok",
        "malloc #5 (5000 bytes): ok",
    ]
    assert run.exit_code == 1
    assert [e.arg("size") for e in run.events] == [1000, 2000, 3000, 4000, 5000]
    untraced = run_plain([path])
    assert untraced.exit_code == 0 and b"NULL" not in untraced.stdout


def test_return_handler_changes_the_return_value(target):
    path = target("loop.c")
    entry = make_probe(path, "work", "i=%di:s32")
    ret = make_probe(path, "work", "r=$retval:s32", kind="r", event="work_ret")
    seen: list[tuple[int, int, str | None, int | None]] = []

    def read_args(ctx: HitContext) -> None:
        name = ctx.read_string(ctx.reg("si"))
        seen.append((ctx.arg("i"), ctx.reg("rdi"), name and name.decode(), ctx.return_address))

    def force_ten(ctx: HitContext) -> None:
        assert ctx.is_return and ctx.retval == ctx.arg("r")
        assert ctx.entry_timestamp_ns is not None
        assert ctx.entry_timestamp_ns <= ctx.timestamp_ns
        ctx.override_return(10)

    run = run_traced([entry, ret], [path, "4"], handlers=[(entry, read_args), (ret, force_ten)])
    assert run.stdout == b"sum=40 counter=13\n"
    assert run.exit_code == 3
    assert seen == [
        (0, 0, "even", None),
        (1, 1, "odd", None),
        (2, 2, "even", None),
        (3, 3, "odd", None),
    ]
    # The event shows what the function returned; the caller got the handler's value.
    assert [e.arg("r") for e in run.named("work_ret")] == [118, 130, 122, 134]


def test_handler_writes_memory_and_registers(target):
    path = target("loop.c")
    entry = make_probe(path, "work")

    def rename(ctx: HitContext) -> None:
        ctx.set_reg("di", 100)  # i
        address = ctx.reg("si")
        ctx.write(address, b"E")  # into read-only data: "even" -> "Even", "odd" -> "Edd"

    run = run_traced([entry], [path, "2"], handlers=[(entry, rename)])
    # work(100, "E...", b) = 200 + 'E' + 17 = 286, twice; counter = 7 + 100 + 100
    assert run.stdout == b"sum=572 counter=207\n"


def test_a_failing_handler_stops_tracing_but_not_the_program(target):
    path = target("loop.c")
    entry = make_probe(path, "work", "i=%di:s32")

    def broken(ctx: HitContext) -> None:
        if ctx.arg("i") == 1:
            raise ValueError("handler bug")

    with pytest.raises(ValueError, match="handler bug"):
        run_traced([entry], [path, "5"], handlers=[(entry, broken)])
