"""collect.py against an independent reading: pyelftools' symbols run through the rules written
out plainly (drop `.symtab` repeats, group by address, rank the primary name, offsets by PT_LOAD).

The production code is written for speed as flat passes over packed tuples; this test holds it
to the same answers on compiled libraries and on the system's libc, python3 and bash.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerSymSection

from probescope.errors import SymbolError
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs

FUNCTION_TYPES = ("STT_FUNC", "STT_LOOS")  # pyelftools names STT_GNU_IFUNC STT_LOOS
SOURCE_RANK = {"dynsym": 0}
BINDING_RANK = {"global": 0, "unique": 0, "weak": 1, "local": 2}
BINDINGS = {"STB_GLOBAL": "global", "STB_WEAK": "weak", "STB_LOCAL": "local", "STB_LOOS": "unique"}


def _functions(elf: ELFFile, section_name: str) -> list[tuple[int, object]]:
    section = elf.get_section_by_name(section_name)
    if section is None:
        return []
    return [
        (number, symbol)
        for number, symbol in enumerate(section.iter_symbols())
        if symbol["st_info"]["type"] in FUNCTION_TYPES
        and symbol["st_shndx"] != "SHN_UNDEF"
        and symbol["st_value"] != 0
    ]


def _versions(elf: ELFFile) -> dict[int, tuple[str | None, bool]]:
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    if versym is None:
        return {}
    defined = {}
    verdef = elf.get_section_by_name(".gnu.version_d")
    if verdef is not None:
        for entry, aux in verdef.iter_versions():
            if not entry["vd_flags"] & 1:
                defined[entry["vd_ndx"]] = next(aux).name
    found = {}
    for number in range(versym.num_symbols()):
        ndx = versym.get_symbol(number)["ndx"]
        value = ndx if isinstance(ndx, int) else {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}[ndx]
        name = defined.get(value & 0x7FFF)
        found[number] = (name, bool(value & 0x8000) if name else False)
    return found


def _spelled(name: str, version: str | None, hidden: bool) -> str:
    return name if version is None else f"{name}{'@' if hidden else '@@'}{version}"


def _reference(path: str, debug_file: str | None) -> list[tuple]:
    """(offset, primary spelling, aliases, size, binding, is_ifunc, source) per function."""
    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        loads = [
            (s["p_vaddr"], s["p_filesz"], s["p_offset"])
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
        ]
        versions = _versions(elf)
        entries = []  # (value, name, version, hidden, binding, size, is_ifunc, source)
        for number, symbol in _functions(elf, ".dynsym"):
            version, hidden = versions.get(number, (None, False))
            entries.append(_entry(symbol, symbol.name, version, hidden, "dynsym"))
        own_symtab = elf.get_section_by_name(".symtab") is not None
        static: list[tuple[int, object]] = _functions(elf, ".symtab") if own_symtab else []
        source = "symtab"
    if not own_symtab and debug_file is not None:
        with open(debug_file, "rb") as stream:
            static = _functions(ELFFile(stream), ".symtab")
        source = "build-id"
    dynamic_spellings = {(e[1], e[0]) for e in entries}
    dynamic_spellings |= {(_spelled(e[1], e[2], e[3]), e[0]) for e in entries if e[2]}
    for _, symbol in static:
        if (symbol.name, symbol["st_value"]) in dynamic_spellings:
            continue
        name, version, hidden = symbol.name, None, False
        if "@" in name[1:]:
            at = name.index("@", 1)
            hidden = not name.startswith("@@", at)
            name, version = name[:at], name[at:].lstrip("@") or None
        entries.append(_entry(symbol, name, version, hidden, source))
    by_address: dict[int, list[tuple]] = {}
    for entry in entries:
        by_address.setdefault(entry[0], []).append(entry)
    functions = []
    for value, group in by_address.items():
        offset = next((value - v + o for v, size, o in loads if v <= value < v + size), None)
        if offset is None:
            continue
        first: dict[tuple[str, str | None, bool], tuple] = {}
        for entry in group:
            first.setdefault((entry[1], entry[2], entry[3]), entry)
        versioned = {name for name, version, _ in first if version is not None}
        kept = [e for k, e in first.items() if k[1] is not None or k[0] not in versioned]
        kept.sort(
            key=lambda e: (
                SOURCE_RANK.get(e[7], 1),
                e[3],
                BINDING_RANK[e[4]],
                len(e[1]) - len(e[1].lstrip("_")),
                len(e[1]),
                e[1],
                e[2] or "",
            )
        )
        functions.append(
            (
                offset,
                _spelled(kept[0][1], kept[0][2], kept[0][3]),
                tuple(_spelled(e[1], e[2], e[3]) for e in kept[1:]),
                max(e[5] for e in group),
                kept[0][4],
                any(e[6] for e in group),
                kept[0][7],
            )
        )
    return sorted(functions)


def _entry(symbol, name: str, version: str | None, hidden: bool, source: str) -> tuple:  # type: ignore[no-untyped-def]
    return (
        symbol["st_value"],
        name,
        version,
        hidden,
        BINDINGS.get(symbol["st_info"]["bind"], "global"),
        symbol["st_size"],
        symbol["st_info"]["type"] == "STT_LOOS",
        source,
    )


@pytest.mark.parametrize(
    "binary",
    [
        pytest.param(programs.versioned_library, id="versioned-library"),
        pytest.param(programs.duplicates, id="duplicate-names"),
        pytest.param(lambda: programs.demo(pie=False, optimize="-O2"), id="exec-O2"),
        pytest.param(lambda: Path("/usr/lib/x86_64-linux-gnu/libc.so.6"), id="libc"),
        pytest.param(lambda: Path("/usr/bin/python3.11"), id="python3"),
        pytest.param(lambda: Path("/bin/bash"), id="bash"),
    ],
)
def test_functions_match_the_plain_rules(binary: Callable[[], Path]) -> None:
    path = str(binary())
    if not Path(path).exists():
        pytest.skip(f"{path} is not installed")
    table = SymbolTable.for_path(path, use_cache=False)
    if table.debug_file is None and not table.has_symtab and "dynsym" not in table.sources:
        pytest.skip(f"{path} has no symbols to compare")
    ours = sorted(
        (f.offset, f.display_name, f.aliases, f.size, f.binding, f.is_ifunc, f.source)
        for f in table.functions
    )
    assert ours == _reference(path, table.debug_file)
    for function in table.functions:  # every spelling finds its function, or one of its twins
        for spelling in function.names:
            try:
                found = table.lookup(spelling)
            except SymbolError as error:
                assert "ambiguous" in error.message
                continue
            assert found == function or spelling in found.names
