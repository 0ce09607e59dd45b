"""`probescope list usdt`: arguments, the listing, globs, summaries, exit codes, `-p PID`."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from probescope.cli import list_usdt as command
from probescope.errors import SymbolError
from probescope.symbols.locate import locate_binary
from probescope.symbols.usdt import find_usdt
from unit.usdt import usdt_programs as programs

PYTHON = "/usr/bin/python3.11"


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="probescope list usdt")
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = command.run(_parse(*argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_arguments() -> None:
    args = _parse("python3", "python:gc*", "-p", "42", "-v")
    assert (args.target, args.glob, args.pid, args.verbose) == ("python3", "python:gc*", 42, True)
    assert _parse("c").glob is None
    with pytest.raises(SystemExit):
        _parse("c", "-p", "notanumber")


def test_listing_of_a_probe_with_refused_arguments() -> None:
    path = programs.demo(True, "-O2")
    (refused,) = find_usdt(path, "hand", "refused")
    status, out, err = _run(str(path), "hand:refused")
    assert status == 0
    assert out.splitlines() == [
        "hand:refused  1 site  no semaphore",
        f"  {refused.sites[0].pc_offset:#x} arg1=? arg2=? arg3=? arg4=? arg5=? arg6=%dx:u64",
        "      argument 1 ('8@(%rbx,%rcx,8)'): base+index*scale addressing has no fetcharg form",
        "      argument 2 ('8f@%xmm0'): floating-point/vector register %xmm0 cannot be fetched "
        "by a uprobe",
        "      argument 3 ('8@%fs:0x28'): segment-relative address (%fs:) cannot be fetched "
        "by a uprobe",
        "      argument 4 ('1@%ah'): %ah is bits 8-15 of %ax, which a fetcharg cannot shift out",
        "      argument 5 ('16@%rax'): a 16-byte value has no fetch type (the kernel's are 1, 2, "
        "4 or 8 bytes)",
    ]
    assert err == f"{path}: ET_DYN x86_64; 1 of 14 USDT probes at 1 site\n"


def test_listing_shows_every_site_semaphores_and_notes() -> None:
    path = programs.gated(False)
    probes = {p.name: p for p in find_usdt(path, "gated", "*")}
    status, out, err = _run(str(path), "-v")
    assert status == 0
    hit, always = probes["hit"], probes["always"]
    assert out.splitlines() == [
        f"gated:always  1 site  semaphore {always.semaphore_offset:#x}",
        f"  {always.sites[0].pc_offset:#x} arg1=%bp:s32",
        "      sdt: -4@%ebp",
        f"gated:hit  1 site  semaphore {hit.semaphore_offset:#x}",
        f"  {hit.sites[0].pc_offset:#x} arg1=%bx:s32 arg2=%bp:s64",
        "      sdt: -4@%ebx -8@%rbp",
    ]
    assert err == f"{path}: ET_EXEC x86_64; 2 USDT probes at 2 sites\n"


def test_inlined_probes_list_each_site_and_float_notes() -> None:
    path = programs.demo(True, "-O0")
    status, out, _ = _run(str(path), "demo:[fi]*")
    lines = out.splitlines()
    assert status == 0
    assert lines[0] == "demo:floats  1 site  no semaphore"
    assert lines[2:4] == [
        "      arg1: floating-point value: fetched as its raw bits",
        "      arg2: floating-point value: fetched as its raw bits",
    ]
    assert "demo:inlined  2 sites  no semaphore" in lines
    # floats, indexed, inlined (2 sites), ints
    assert sum(1 for line in lines if line.startswith("  0x")) == 5


def test_a_glob_without_colon_matches_provider_or_name() -> None:
    path = str(programs.demo())
    _, by_provider, _ = _run(path, "hand")
    _, by_name, _ = _run(path, "start")
    assert [line for line in by_provider.splitlines() if not line.startswith(" ")] == [
        "hand:address  1 site  no semaphore",
        "hand:memory  1 site  no semaphore",
        "hand:refused  1 site  no semaphore",
        "hand:symbols  1 site  no semaphore",
        "hand:widths  1 site  no semaphore",
    ]
    assert by_name.splitlines() == [
        "demo:start  1 site  no semaphore",
        f"  {find_usdt(path, 'demo', 'start')[0].sites[0].pc_offset:#x}  (no arguments)",
    ]


def test_no_match_exits_1_and_lists_what_there_is() -> None:
    status, out, err = _run(str(programs.gated()), "gated:nothing")
    assert (status, out) == (1, "")
    assert err.splitlines()[-1] == (
        "no USDT probe matches 'gated:nothing'; the file has: gated:always, gated:hit"
    )


def test_a_file_without_probes() -> None:
    libc = str(locate_binary("c"))
    status, out, err = _run("c")
    assert (status, out) == (0, "")
    assert err.splitlines() == [
        f"{libc}: ET_DYN x86_64; 0 USDT probes at 0 sites",
        f"note: {libc} has no .note.stapsdt section: it was not built with <sys/sdt.h>",
    ]


def test_a_library_by_short_name() -> None:
    try:
        library = locate_binary("stdc++")
    except SymbolError:
        pytest.skip("libstdc++ is not installed here")
    status, out, _ = _run("stdc++", "libstdcxx:throw")
    assert status == 0
    assert out.splitlines()[0] == "libstdcxx:throw  1 site  no semaphore"
    assert out.splitlines()[1].endswith("arg1=%di:u64 arg2=%si:u64")
    assert library.exists()


def test_errors_from_locating_the_target_propagate() -> None:
    with pytest.raises(SymbolError):
        _run("/nonexistent/usdt-target")


def test_with_a_pid_addresses_and_semaphore_values_are_read_from_the_process() -> None:
    if not os.path.exists(PYTHON):
        pytest.skip("python3.11 is not installed here")
    process = subprocess.Popen(
        [PYTHON, "-c", "import sys, time; print(flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()
        status, out, _ = _run("python3.11", "-p", str(process.pid))
        lines = out.splitlines()
        (gc_start,) = find_usdt(PYTHON, "python", "gc__start")
        site = gc_start.sites[0]
        header = lines.index(
            f"python:gc__start  1 site  semaphore {gc_start.semaphore_offset:#x} "
            f"(= 0 in process {process.pid})"
        )
        # python3.11 is ET_EXEC: its text is mapped at its link-time addresses
        assert lines[header + 1] == f"  {site.pc_offset:#x} ({site.pc:#x}) arg1=+112(%sp):s32"
        assert status == 0
    finally:
        process.kill()
        process.wait()


def test_a_pid_that_does_not_map_the_target(tmp_path: Path) -> None:
    process = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        path = programs.gated()
        status, out, err = _run(str(path), "-p", str(process.pid))
        assert status == 0
        assert "(= " not in out
        assert f"note: {path} is not mapped in process {process.pid}" in err
    finally:
        process.kill()
        process.wait()
