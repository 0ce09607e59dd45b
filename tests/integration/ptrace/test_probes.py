"""Entry and return probes on compiled programs: event sequences, argument values, and the
program's own behaviour unchanged."""

from __future__ import annotations

from integration.ptrace.harness import assert_same_behaviour, make_probe, run_plain, run_traced
from probescope.events import EventBatch


def test_entry_probe_args_in_a_loop(target):
    path = target("loop.c")
    probe = make_probe(
        path,
        "work",
        "i=%di:s32 name=+0(%si):string b=+0(%dx):b5@3/32 "
        "c=+0(%si):char first=+0(%si):u8[2] counter=@+0x0:u8",
    )
    run = run_traced([probe], [path, "6"])
    assert_same_behaviour(run, run_plain([path, "6"]))
    assert run.exit_code == 3
    events = run.named("work")
    assert [e.arg("i") for e in events] == list(range(6))
    assert [e.arg("name") for e in events] == ["even", "odd"] * 3
    assert {e.arg("b") for e in events} == {17}
    assert [e.arg("c") for e in events] == ["e", "o"] * 3
    assert events[0].arg("first") == (ord("e"), ord("v"))
    pid = run.engine.pids[0]
    assert {(e.pid, e.tid) for e in events} == {(pid, pid)}
    assert {e.comm for e in events} == {"loop"}
    assert len({e.ip for e in events}) == 1
    assert all(e.ret_ip is None for e in events)
    assert [e.timestamp_ns for e in events] == sorted(e.timestamp_ns for e in events)
    assert run.stats.hits == {"ptrace_test/work": 6}


def test_file_offset_fetch_reads_a_global(target):
    path = target("loop.c")
    from integration.ptrace.harness import elf_symbol

    work = elf_symbol(path, "work")
    counter = elf_symbol(path, "counter")
    # @+OFFSET is relative to the probed (text) segment's load bias: pass vaddr - bias.
    probe = make_probe(path, "work", f"counter=@+0x{counter.vaddr:x}:s64 i=%di:s32")
    assert work.vaddr - work.offset == 0
    run = run_traced([probe], [path, "4"])
    values = [e.arg("counter") for e in run.named("work")]
    assert values == [7, 7, 8, 10]


def test_return_probes_nest_with_recursion_and_tail_calls(target):
    path = target("recursion.c")
    probes = [
        make_probe(path, "fib", "n=%di:s64", event="fib_entry"),
        make_probe(path, "fib", "ret=$retval:s64", kind="r", event="fib_return"),
        make_probe(path, "tail_a", "ret=$retval:s64", kind="r", event="tail_a_return"),
        make_probe(path, "tail_b", "ret=$retval:s64", kind="r", event="tail_b_return"),
    ]
    run = run_traced(probes, [path, "5"])
    assert_same_behaviour(run, run_plain([path, "5"]))

    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    expected: list[tuple[str, int]] = []

    def walk(n: int) -> None:
        expected.append(("fib_entry", n))
        if n >= 2:
            walk(n - 1)
            walk(n - 2)
        expected.append(("fib_return", fib(n)))

    walk(5)
    seen = [(e.name, e.args[0]) for e in run.events if e.name.startswith("fib")]
    assert seen == expected
    fib_returns = run.named("fib_return")
    entry_ip = run.named("fib_entry")[0].ip
    assert {e.ip for e in fib_returns} == {entry_ip}
    assert all(e.ret_ip is not None for e in fib_returns)
    tails = [(e.name, e.arg("ret")) for e in run.events if e.name.startswith("tail")]
    assert tails == [("tail_b_return", 15), ("tail_a_return", 15)]


def test_return_probe_depth_limit(target):
    path = target("recursion.c")
    probe = make_probe(path, "deep", "ret=$retval:s64", kind="r")
    run = run_traced([probe], [path, "3"])
    assert_same_behaviour(run, run_plain([path, "3"]))
    # deep(100) recurses 101 calls deep; like the kernel, only the 64 outermost calls get a
    # return instance (deep(100)..deep(37), returning 37..100 innermost first).
    assert [e.arg("ret") for e in run.named("deep")] == list(range(37, 101))
    assert run.stats.extra["depth_omitted"] == 101 - 64


def test_idle_ticks_are_empty_batches(target):
    import time

    path = target("spin.c")
    probe = make_probe(path, "tick", "i=%di:s64")
    from probescope.engines.base import Target
    from probescope.engines.ptrace import PtraceEngine

    engine = PtraceEngine()
    engine.attach([probe], Target(command=("sleep", "0.5")))
    start = time.monotonic()
    batches = [item for item in engine.events() if isinstance(item, EventBatch)]
    assert time.monotonic() - start >= 0.45
    assert len(batches) >= 3
    assert all(len(b) == 0 for b in batches)
    assert engine.exit_code == 0
