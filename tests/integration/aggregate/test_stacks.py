"""User stacks on real binaries: a program built without frame pointers and calls back from
libc (which has none on Debian) are unwound by CFI from a copy of the stack, the same from both
engines, and as `perf record --call-graph dwarf` unwinds them; frame pointers where present;
kernel stacks of tracepoints."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from integration.aggregate.conftest import AVAILABLE, ENGINES, target
from integration.aggregate.stack_oracle import (
    innermost,
    names,
    perf_skip_reason,
    perf_stacks,
)
from probescope.aggregate.stack_capture import MAX_SNAPSHOT
from probescope.aggregations import count, stacks

pytestmark = pytest.mark.root

LIBC_START = [("libc.so.6", "__libc_start_call_main"), ("libc.so.6", "__libc_start_main")]


def stack_counts(result: object) -> Counter[tuple[tuple[str, str], ...]]:
    found: Counter[tuple[tuple[str, str], ...]] = Counter()
    for key, n in result.first.counts().items():  # type: ignore[attr-defined]
        found[names(key[-1])] += n
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_cfi_walks_a_program_without_frame_pointers(engine: str, callers: Path) -> None:
    result = stacks([f"{callers}:leaf"], command=[str(callers), "10"], engine=engine)
    assert result.first.key_names == ("ustack",)
    exe = callers.name
    tail = [(exe, "top"), (exe, "main"), *LIBC_START, (exe, "_start")]
    assert stack_counts(result) == {
        ((exe, "leaf"), (exe, "mid_a"), *tail): 5,
        ((exe, "leaf"), (exe, "mid_b"), *tail): 5,
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_cfi_walks_through_libc(engine: str, callers: Path) -> None:
    result = stacks([f"{callers}:compare"], command=[str(callers), "1"], engine=engine)
    for stack, _ in stack_counts(result).items():
        assert stack[0] == (callers.name, "compare")
        assert any(module == "libc.so.6" for module, _ in stack[1:])
        assert (callers.name, "main") in stack
        assert stack[-1] == (callers.name, "_start")


@pytest.mark.parametrize("engine", ENGINES)
def test_stacks_through_a_library_loaded_later(engine: str) -> None:
    """The library is dlopen'ed after the probes were armed, and the program has exited when
    its stacks are symbolized: the maps kept at its exit still place the frames."""
    loader = target("loader", ("-O2", "-fomit-frame-pointer", "-g", "-ldl"))
    plugin = target("plugin", ("-O2", "-fomit-frame-pointer", "-g", "-shared", "-fPIC"))
    library = plugin.with_name("libplug.so")
    if not library.exists():
        library.symlink_to(plugin.name)
    result = stacks(
        [f"{library}:plug_leaf"], command=[str(loader), str(library), "3"], engine=engine
    )
    ((stack, count),) = stack_counts(result).items()
    assert count == 3
    lib = plugin.name
    assert stack[:3] == ((lib, "plug_leaf"), (lib, "plug_entry"), (loader.name, "main"))


def test_engines_agree_on_stacks(callers: Path) -> None:
    found = [
        stack_counts(stacks([f"{callers}:compare"], command=[str(callers), "4"], engine=e))
        for e in AVAILABLE
    ]
    assert all(stacks_of_engine == found[0] for stacks_of_engine in found[1:])
    assert sum(found[0].values()) > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_frame_pointers(engine: str, callers_fp: Path) -> None:
    result = stacks(
        [f"{callers_fp}:leaf"], stack_method="fp", command=[str(callers_fp), "4"], engine=engine
    )
    exe = callers_fp.name
    found = innermost(stack_counts(result), 4)
    assert found == {
        ((exe, "leaf"), (exe, "mid_a"), (exe, "top"), (exe, "main")): 2,
        ((exe, "leaf"), (exe, "mid_b"), (exe, "top"), (exe, "main")): 2,
    }


def test_matches_perf_on_a_program_without_frame_pointers(callers: Path) -> None:
    reason = perf_skip_reason()
    if reason:
        pytest.skip(reason)
    argv = [str(callers), "10"]
    try:
        reference = perf_stacks(str(callers), "compare", argv, stack_size=MAX_SNAPSHOT)
    except RuntimeError as error:
        pytest.skip(f"perf cannot record here: {error}")
    for function in ("compare", "leaf"):
        reference = perf_stacks(str(callers), function, argv, stack_size=MAX_SNAPSHOT)
        ours = stack_counts(stacks([f"{callers}:{function}"], command=argv, engine="tracefs"))
        assert reference - ours == Counter()  # perf may drop samples, never add
        assert sum(ours.values()) == (10 if function == "leaf" else 17)


def test_matches_perf_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """malloc called by python3.11 (libc and python without frame pointers): the callers perf
    finds are the callers probescope finds."""
    reason = perf_skip_reason()
    if reason:
        pytest.skip(reason)
    python = "/usr/bin/python3.11"
    if not Path(python).exists():
        pytest.skip("no /usr/bin/python3.11")
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    argv = [python, "-S", "-c", "pass"]
    try:
        reference = perf_stacks(libc, "malloc", argv, stack_size=MAX_SNAPSHOT)
    except RuntimeError as error:
        pytest.skip(f"perf cannot record here: {error}")
    ours = stack_counts(stacks(["c:malloc"], command=argv, engine="tracefs"))
    # Both copy the same 3008 bytes of stack and unwind the same frames from them, whole
    # stacks compared. perf may drop samples (its buffer overflows with 3 KiB per sample on a
    # busy machine), and python's start-up differs by a few allocations from run to run.
    shared = sum((reference & ours).values())
    assert sum(reference.values()) > 500
    assert shared >= 0.99 * sum(reference.values())


def test_kernel_stacks_of_a_tracepoint(callers: Path) -> None:
    result = count(["t:sched:sched_process_exec"], by=["kstack"], command=[str(callers), "1"])
    ((key, n),) = result.first.counts().items()
    assert n == 1
    functions = [frame.function for frame in key[0]]
    assert any("execve" in f for f in functions), functions
    assert all(frame.module.startswith("[") for frame in key[0])
