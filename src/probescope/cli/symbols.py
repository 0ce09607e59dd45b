"""`probescope symbols TARGET [GLOB] [-p PID]`: list functions with their uprobe file offsets,
C++ and Rust names demangled as `nm -C` does (the GLOB matches either spelling)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from probescope.symbols.function import FunctionSymbol
from probescope.symbols.locate import locate_binary
from probescope.symbols.maps import mappings_of
from probescope.symbols.table import SymbolTable
from probescope.system.maps import Mapping


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="TARGET", help="a path, a command on PATH or a library (c, libssl.so.3)"
    )
    parser.add_argument(
        "glob", metavar="GLOB", nargs="?", help="only functions matching this shell glob"
    )
    parser.add_argument(
        "-p",
        "--pid",
        type=int,
        help="resolve TARGET as process PID sees it and show runtime addresses in it",
    )
    parser.add_argument(
        "--debug-dir",
        action="append",
        metavar="DIR",
        help="look for debug files here instead of /usr/lib/debug (repeatable)",
    )
    parser.add_argument("--no-cache", action="store_true", help="ignore the symbol cache")
    parser.add_argument(
        "--no-demangle", action="store_true", help="show C++ and Rust names as they are mangled"
    )


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    path = str(locate_binary(args.target, args.pid))
    table = SymbolTable.for_path(path, debug_dirs=args.debug_dir, use_cache=not args.no_cache)
    functions = table.match(args.glob) if args.glob else table.functions
    mappings = mappings_of(args.pid, table.identity) if args.pid is not None else None
    err.write(describe(table, len(functions)) + "\n")
    spell = None if args.no_demangle else table.demangled.spelling
    for line in format_listing(functions, mappings, spell):
        out.write(line + "\n")
    if table.stripped:
        err.write(
            "note: the file is stripped; only its exported functions are listed\n"
            f"hint: {table.debug_info_hint()}\n"
        )
    return 0 if functions or not args.glob else 1


def describe(table: SymbolTable, shown: int) -> str:
    """The summary line: what the file is and where its symbols came from."""
    build_id = f", build-id {table.build_id}" if table.build_id else ""
    count = f"{shown} of {len(table.functions)}" if shown != len(table.functions) else str(shown)
    return (
        f"{table.path}: {table.type_name} {table.machine_name}{build_id}; "
        f"{count} functions from {table.describe_sources()}"
    )


def format_listing(
    functions: Sequence[FunctionSymbol],
    mappings: Sequence[Mapping] | None = None,
    spell: Callable[[str], str] | None = None,
) -> list[str]:
    """Aligned rows (offset, size, binding, kind, [address], name and aliases), header first;
    `spell` turns each name into the text shown (SymbolTable.demangled.spelling)."""
    spell = spell or str
    header = ["OFFSET", "SIZE", "BIND", "KIND"]
    if mappings is not None:
        header.append("ADDRESS")
    rows = []
    for function in functions:
        row = [f"{function.offset:#x}", str(function.size), function.binding, function.kind]
        if mappings is not None:
            row.append(_address(function.offset, mappings))
        aliases = ", ".join(map(spell, function.aliases))
        row.append(spell(function.display_name) + (f"  ({aliases})" if aliases else ""))
        rows.append(row)
    columns = len(header)
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(columns)]
    right = {1}  # sizes read best right-aligned

    def line(cells: Sequence[str]) -> str:
        parts = [
            cells[i].rjust(widths[i]) if i in right else cells[i].ljust(widths[i])
            for i in range(columns)
        ]
        return "  ".join([*parts, *cells[columns:]]).rstrip()

    return [line([*header, "NAME"]), *(line(r) for r in rows)]


def _address(offset: int, mappings: Sequence[Mapping]) -> str:
    for mapping in mappings:
        if mapping.contains_file_offset(offset):
            return f"{mapping.address_of(offset):#x}"
    return "-"
