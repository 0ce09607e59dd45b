"""Cross-engine differential tests: the same specs on the same programs give the same events on
`--engine ptrace`, `--engine tracefs`, `--engine bpf` and `--engine fentry` (address
randomization is off in every run, so even the addresses agree; timestamps, cpu and process ids
aside), and the program's own output and exit status are the same with every engine and without
probescope. The bpf engine takes part where the kernel lets this process use BPF; the fentry
engine wherever it takes every probe itself (function entries and returns whose arguments need
no memory reads), not through its fallback."""

from __future__ import annotations

import functools
import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from probescope.engines.fentry.engine import FentryEngine
from probescope.engines.registry import BY_NAME, availability
from probescope.events import Event
from probescope.session import Session
from probescope.symbols.table import SymbolTable
from support.build import compile_program

pytestmark = pytest.mark.root

TARGETS = Path(__file__).parents[2] / "targets" / "ptrace"


def no_aslr() -> list[str]:
    source = (TARGETS.parent / "norandom.c").read_text()
    return [str(compile_program(source, "norandom", ("-O1",)))]


def build(name: str, flags: tuple[str, ...] = ("-O0", "-g")) -> Path:
    language = "c++" if name.endswith(".cc") else "c"
    return compile_program(
        (TARGETS / name).read_text(), name.split(".")[0], flags, language=language
    )


Key = tuple[str, str, int, int | None, tuple[object, ...]]


def run(engine: str, specs: list[str], argv: list[str]) -> tuple[list[Event], int | None]:
    session = Session(specs, engine=engine, command=[*no_aslr(), *argv])
    with session:
        events = list(session.events(duration=60))
    stats = session.summary().stats
    assert stats is not None
    status = stats.command_status
    return events, status


def by_process(events: list[Event]) -> list[list[Key]]:
    """Event sequences per thread, threads in order of their first event; pids replaced by that
    order so runs compare."""
    threads: dict[int, list[Key]] = defaultdict(list)
    for event in events:
        threads[event.tid].append(
            (event.group, event.name, event.ip, event.ret_ip, tuple(event.args))
        )
    return sorted(threads.values())


@functools.cache
def engines() -> tuple[str, ...]:
    """tracefs and ptrace, and bpf where it is available."""
    bpf = availability(BY_NAME["bpf"])
    return ("tracefs", "ptrace", "bpf") if bpf.ok else ("tracefs", "ptrace")


def engines_for(specs: list[str]) -> tuple[str, ...]:
    """engines(), and fentry when it can run here and takes every probe."""
    fentry = FentryEngine()
    if not fentry.available().ok or fentry.refusals(Session(specs).probes):
        return engines()
    return (*engines(), "fentry")


def agree(specs: list[str], argv: list[str], check: Callable[[list[Event]], None]) -> None:
    plain = subprocess.run([*no_aslr(), *argv], capture_output=True, text=True, timeout=60)
    results = {}
    for engine in engines_for(specs):
        events, status = run(engine, specs, argv)
        check(events)
        results[engine] = (by_process(events), status)
    for engine in results:
        assert results[engine][0] == results["tracefs"][0], f"{engine} differs from tracefs"
        assert results[engine][1] == results["tracefs"][1] == plain.returncode, engine


def site(binary: Path, label: str) -> str:
    """`PATH:0xOFFSET` of a global label (the instruction-class sites of sites.c)."""
    table = SymbolTable.for_path(binary)
    image_offset = _label_offset(binary, label, table)
    return f"{binary}:{image_offset:#x}"


def _label_offset(binary: Path, label: str, table: SymbolTable) -> int:
    output = subprocess.run(["nm", str(binary)], capture_output=True, text=True, check=True).stdout
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == label:
            offset = table.vaddr_to_offset(int(parts[0], 16))
            assert offset is not None
            return offset
    raise AssertionError(f"{label} not in {binary}")


def test_recursion_and_tail_calls() -> None:
    binary = build("recursion.c")
    specs = [
        f"{binary}:fib n=arg1:s64",
        f"r:{binary}:fib ret=retval:s64",
        f"{binary}:tail_a x=arg1:s64",
        f"r:{binary}:tail_b ret=retval:s64",
    ]
    agree(specs, [str(binary)], lambda events: assert_some(events, "fib__return", 10))


def test_threads() -> None:
    binary = build("threads.c", ("-O0", "-g", "-pthread"))
    agree(
        [f"{binary}:work id=arg1:s64 i=arg2:s64", f"r:{binary}:work ret=retval:s64"],
        [str(binary)],
        lambda events: assert_some(events, "work", 4),
    )


def test_fork_and_vfork_children() -> None:
    binary = build("forks.c")
    agree(
        [f"{binary}:work who=arg1:s32 i=arg2:s32"],
        [str(binary)],
        lambda events: assert_processes(events, 2),
    )


def test_exec_reresolves() -> None:
    binary = build("execs.c")
    agree(
        [f"{binary}:work generation=arg1:s32", f"r:{binary}:work ret=retval:s32"],
        [str(binary)],
        lambda events: assert_some(events, "work", 2),
    )


def test_dlopen_library_loaded_later() -> None:
    binary = build("dlopen.c", ("-O0", "-g", "-ldl"))
    plugin = compile_program(
        (TARGETS / "plugin.c").read_text(), "libplugin.so", ("-O0", "-g", "-shared", "-fPIC")
    )
    agree(
        [f"{plugin}:plugin_fn x=arg1:s32", f"r:{plugin}:plugin_fn ret=retval:s32"],
        [str(binary), str(plugin)],
        lambda events: assert_some(events, "plugin_fn", 6),
    )


def test_longjmp_over_hijacked_returns() -> None:
    binary = build("longjmp.c")
    agree(
        [f"{binary}:leaf n=arg1:s32", f"r:{binary}:leaf ret=retval:s32", f"r:{binary}:middle"],
        [str(binary)],
        lambda events: assert_some(events, "leaf", 6),
    )


def test_cpp_exceptions_beside_return_probes() -> None:
    """Exceptions thrown under a function with a return probe that catches them. (A return
    probe on a function an exception passes *through* makes the kernel's uretprobe trampoline
    stop the unwinder, and the program aborts; the ptrace engine survives that case, so the
    engines cannot agree on it: tests/integration/ptrace/test_unwinding.py covers it.)"""
    binary = build("exceptions.cc")
    agree(
        [
            f"{binary}:_Z7throweri n=arg1:s32",
            f"{binary}:_Z7wrapperi n=arg1:s32",
            f"r:{binary}:_Z5outeri ret=retval:s32",
        ],
        [str(binary)],
        lambda events: assert_some(events, "outer__return", 7),
    )


@pytest.mark.parametrize(
    "label",
    [
        "site_riprel_load",
        "site_riprel_store",
        "site_call",
        "site_jcc",
        "site_jcc_near",
        "site_loop",
        "site_jrcxz",
        "site_jmp",
        "site_ret",
        "site_push",
        "site_icall_reg",
        "site_icall_mem",
    ],
)
def test_instruction_class_sites(label: str) -> None:
    binary = build("sites.c")
    spec = f"p:cross/{label} {site(binary, label)} ax=%ax di=%di sp8=+0(%sp):x64"
    agree([spec], [str(binary)], lambda events: assert_some(events, label, 1))


def test_libc_malloc() -> None:
    binary = build("malloc.c")
    agree(
        ["c:malloc size=arg1:u64", "r:c:malloc"],
        [str(binary)],
        lambda events: assert_some(events, "malloc", 3),
    )


def assert_some(events: list[Event], name: str, at_least: int) -> None:
    assert sum(e.name == name for e in events) >= at_least, [e.name for e in events][:20]


def assert_processes(events: list[Event], at_least: int) -> None:
    assert len({e.pid for e in events}) >= at_least
