"""`probescope symbols`: argument parsing, the aligned listing, summaries and exit codes."""

from __future__ import annotations

import argparse
import io
import os

import pytest

from probescope.cli import symbols as command
from probescope.errors import SymbolError
from probescope.symbols.function import FunctionSymbol
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="probescope symbols")
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = command.run(_parse(*argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_arguments() -> None:
    args = _parse("c", "mem*", "-p", "42", "--debug-dir", "/a", "--debug-dir", "/b")
    assert (args.target, args.glob, args.pid, args.debug_dir) == ("c", "mem*", 42, ["/a", "/b"])
    assert not args.no_cache
    with pytest.raises(SystemExit):
        _parse("c", "-p", "notanumber")


def test_format_listing_aligns_columns() -> None:
    functions = [
        FunctionSymbol("f", None, False, (), 0x1000, 5, 0x1000, "global", False, "symtab"),
        FunctionSymbol(
            "memcpy", "GLIBC_2.14", True, ("__memcpy",), 0x9BE70, 265, 0x9BE70, "global", True, "x"
        ),
    ]
    header, first, second = command.format_listing(functions)
    assert header.split() == ["OFFSET", "SIZE", "BIND", "KIND", "NAME"]
    assert first.split() == ["0x1000", "5", "global", "func", "f"]
    assert second.endswith("memcpy@@GLIBC_2.14  (__memcpy)")
    assert header.index("NAME") == first.rindex(" f") + 1 == second.index("memcpy")
    assert header.index("SIZE") + 4 == first.index("5") + 1  # sizes are right-aligned


def test_lists_a_program_sorted_by_offset() -> None:
    binary = programs.demo()
    status, out, err = _run(str(binary))
    assert status == 0
    lines = out.splitlines()
    offsets = [int(line.split()[0], 16) for line in lines[1:]]
    assert offsets == sorted(offsets)
    table = SymbolTable.for_path(binary)
    assert len(lines) - 1 == len(table.functions)
    add = table.lookup("ps_add")
    assert any(line.split()[0] == f"{add.offset:#x}" and "ps_add" in line for line in lines)
    assert str(binary) in err and "ET_DYN" in err and "functions from" in err


def test_glob_and_aliases() -> None:
    status, out, _ = _run(str(programs.demo()), "ps_alias*")
    assert status == 0
    (row,) = out.splitlines()[1:]
    assert "ps_alias" in row and "ps_weak_alias" in row and "ps_alias_target" in row


def test_no_match_exits_1() -> None:
    status, out, err = _run(str(programs.demo()), "nothing_matches_*")
    assert status == 1
    assert out.splitlines() == [out.splitlines()[0]]
    assert "0 of" in err


def test_stripped_binary_gets_a_hint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    binary, _ = programs.stripped_with_build_id()
    _, _, err = _run(str(binary), "--debug-dir", str(tmp_path))
    assert "stripped" in err and "debuginfod" in err


def test_pid_adds_runtime_addresses() -> None:
    status, out, _ = _run("c", "malloc", "-p", str(os.getpid()))
    assert status == 0
    header, row = out.splitlines()
    assert "ADDRESS" in header
    address = int(row.split()[4], 16)
    import ctypes

    assert address == ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value


def test_unknown_target_raises_symbol_error() -> None:
    with pytest.raises(SymbolError, match="cannot find"):
        _run("probescope-does-not-exist")
