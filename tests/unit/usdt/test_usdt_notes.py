"""USDT notes read from real binaries, checked against binutils' readelf and the files' bytes.

Covers gcc -O0/-O2, PIE and ET_EXEC, a stripped copy, notes kept only in a separate debug file,
semaphores, prelinked files, ELFCLASS32, and the probes of the system's own python3.11,
libpython, libstdc++, ld.so and libc.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probescope.errors import SymbolError
from probescope.symbols.elfimage import ElfImage
from probescope.symbols.locate import locate_binary
from probescope.symbols.usdt import (
    UsdtProbe,
    clear_usdt_cache,
    find_usdt,
    read_usdt_probes,
    usdt_probes,
)
from unit.usdt import usdt_programs as programs

NOP = 0x90
VARIANTS = [(True, "-O0"), (True, "-O2"), (False, "-O0"), (False, "-O2")]


def _sites(probes: list[UsdtProbe]) -> dict[tuple[str, str, int], tuple[str, int | None]]:
    return {
        (p.provider, p.name, s.pc): (s.arguments, s.semaphore or None)
        for p in probes
        for s in p.sites
    }


def _check_against_readelf(path: Path, probes: list[UsdtProbe]) -> None:
    """Every note readelf shows is a site with the same strings, addresses and file offsets."""
    notes = programs.readelf_notes(path)
    loads = programs.readelf_loads(path)
    assert sum(len(p.sites) for p in probes) == len(notes)
    sites = {(p.provider, p.name, s.pc): s for p in probes for s in p.sites}
    data = path.read_bytes()
    for note in notes:
        site = sites[(note.provider, note.name, note.location)]
        assert site.arguments == note.arguments
        assert site.semaphore == note.semaphore
        assert site.pc_offset == programs.oracle_offset(loads, note.location, "E")
        assert data[site.pc_offset] == NOP, f"{note.provider}:{note.name} is not at a nop"
        if note.semaphore:
            assert site.semaphore_offset == programs.oracle_offset(loads, note.semaphore, "W")
        else:
            assert site.semaphore_offset is None


@pytest.mark.parametrize("pie, optimize", VARIANTS)
def test_demo_notes_agree_with_readelf(pie: bool, optimize: str) -> None:
    path = programs.demo(pie, optimize)
    probes = usdt_probes(path)
    _check_against_readelf(path, probes)
    assert [p.full_name for p in probes] == sorted(p.full_name for p in probes)
    names = {p.full_name for p in probes}
    assert {"demo:start", "demo:ints", "demo:literals", "hand:widths", "hand:refused"} <= names


@pytest.mark.parametrize("pie, optimize", VARIANTS)
def test_an_inlined_probe_has_one_site_per_call_site(pie: bool, optimize: str) -> None:
    (inlined,) = find_usdt(programs.demo(pie, optimize), "demo", "inlined")
    assert len(inlined.sites) == 2
    assert inlined.sites[0].pc < inlined.sites[1].pc
    assert all(len(s.args) == 1 and s.args[0].fetcharg for s in inlined.sites)


def test_o0_reads_stack_slots_and_o2_reads_registers() -> None:
    (o0,) = find_usdt(programs.demo(True, "-O0"), "demo", "ints")
    (o2,) = find_usdt(programs.demo(True, "-O2"), "demo", "ints")
    assert all(a.operand and a.operand.kind == "memory" for a in o0.sites[0].args)
    assert all(a.fetcharg and "(%bp):" in a.fetcharg for a in o0.sites[0].args)
    assert all(a.operand and a.operand.kind == "register" for a in o2.sites[0].args)
    # int, long, short, signed char, unsigned, unsigned long long
    assert [a.type_name for a in o2.sites[0].args] == ["s32", "s64", "s16", "s8", "u32", "u64"]


@pytest.mark.parametrize("pie, optimize", VARIANTS)
def test_literal_constants_become_immediates(pie: bool, optimize: str) -> None:
    (literals,) = find_usdt(programs.demo(pie, optimize), "demo", "literals")
    assert [a.fetcharg for a in literals.sites[0].args] == [
        "\\-5:s32",
        "\\123456789012:s64",
        "\\-56:u8",  # (unsigned char)200 as gcc prints it; u8 of -56 is 200
        "\\0:s32",
    ]


def test_o2_globals_are_ip_relative_and_indexed_loads_are_refused() -> None:
    path = programs.demo(True, "-O2")
    symbols = programs.nm_addresses(path)
    (globals_,) = find_usdt(path, "demo", "globals")
    site = globals_.sites[0]
    assert site.arguments == "-4@g_counter(%rip) -8@8+g_point(%rip) -4@g_point(%rip)"
    assert [a.fetcharg for a in site.args] == [
        f"+{symbols['g_counter'] - site.pc}(%ip):s32",
        f"+{symbols['g_point'] + 8 - site.pc}(%ip):s64",
        f"+{symbols['g_point'] - site.pc}(%ip):s32",
    ]
    (indexed,) = find_usdt(path, "demo", "indexed")
    first = indexed.sites[0].args[0]
    assert first.fetcharg is None
    assert first.problem is not None and "base+index*scale" in first.problem


@pytest.mark.parametrize("pie", [True, False])
def test_hand_written_notes(pie: bool) -> None:
    path = programs.demo(pie, "-O2")
    symbols = programs.nm_addresses(path)
    by_name = {p.name: p.sites[0] for p in find_usdt(path, "hand", "*")}
    assert [a.fetcharg for a in by_name["widths"].args] == [
        "%cx:s32",
        "%r9:s16",
        "%si:s8",
        "%r8:u64",
        "%r10:s32",
        "%r11:s8",
        "%bx:s16",
        "%di:u64",
    ]
    assert [a.fetcharg for a in by_name["memory"].args] == [
        "+0(%bx):s64",
        "+8(%bx):s32",
        "-8(%dx):u64",
        "+0(%dx):s16",
    ]
    pc = by_name["symbols"].pc
    counter, pair = symbols["g_counter"] - pc, symbols["g_pair"] - pc
    assert [a.fetcharg for a in by_name["symbols"].args] == [
        f"+{counter}(%ip):s32",
        f"+{pair + 8}(%ip):s64",
        f"+{pair + 8}(%ip):s64",
        f"+{counter}(%ip):s32",
        f"+{pair}(%ip):s64",
    ]
    address = by_name["address"].args[0]
    if pie:
        assert address.fetcharg is None
        assert (
            address.problem is not None and "depends on where the file is loaded" in address.problem
        )
    else:
        assert address.fetcharg == f"\\{symbols['g_counter']:#x}:u64"
    refused = by_name["refused"]
    assert [a.fetcharg for a in refused.args] == [None] * 5 + ["%dx:u64"]
    assert len(refused.problems) == 5
    with pytest.raises(SymbolError) as caught:
        refused.fetchargs()
    assert "argument 1 ('8@(%rbx,%rcx,8)')" in caught.value.message
    assert "argument 5 ('16@%rax')" in caught.value.message
    assert by_name["widths"].fetchargs()[0] == "arg1=%cx:s32"


def test_float_arguments_are_raw_bits() -> None:
    for optimize in ("-O0", "-O2"):
        (floats,) = find_usdt(programs.demo(True, optimize), "demo", "floats")
        args = floats.sites[0].args
        assert [(a.is_float, a.size, a.type_name) for a in args] == [
            (True, 8, "x64"),
            (True, 4, "x32"),
        ]
        assert all(a.fetcharg and a.note for a in args)


def test_stripped_binary_keeps_its_notes_but_not_its_local_symbols() -> None:
    stripped, twin = programs.demo_stripped(), programs.demo(True, "-O2")
    assert ElfImage.from_path(stripped).symtab is None
    probes = usdt_probes(stripped)
    _check_against_readelf(stripped, probes)
    assert _sites(probes) == _sites(usdt_probes(twin))
    (symbols,) = find_usdt(stripped, "hand", "symbols")
    assert all(a.fetcharg is None for a in symbols.sites[0].args)
    problem = symbols.sites[0].args[0].problem
    assert problem is not None and "symbol g_counter is not in the file's symbol tables" in problem
    (widths,) = find_usdt(stripped, "hand", "widths")
    (twin_widths,) = find_usdt(twin, "hand", "widths")
    assert widths.sites[0].args == twin_widths.sites[0].args


def test_notes_only_in_the_debug_file_are_placed_with_the_binary_segments() -> None:
    binary, debug = programs.demo_notes_in_debug_file()
    twin = programs.demo(True, "-O2")
    assert ElfImage.from_path(binary).section(".note.stapsdt") is None
    probes = usdt_probes(binary)
    assert probes == usdt_probes(twin)  # offsets, semaphores and every fetcharg
    with ElfImage.from_path(debug) as image, pytest.raises(SymbolError) as caught:
        read_usdt_probes(image)
    assert "is a separate debug file" in caught.value.message
    with ElfImage.from_path(debug) as image, ElfImage.from_path(binary) as layout:
        assert read_usdt_probes(image, layout=layout) == probes


@pytest.mark.parametrize("pie", [True, False])
def test_semaphores_are_file_offsets_in_the_writable_segment(pie: bool) -> None:
    path = programs.gated(pie)
    probes = usdt_probes(path)
    _check_against_readelf(path, probes)
    symbols = programs.nm_addresses(path)
    data = path.read_bytes()
    for probe in probes:
        semaphore = symbols[f"{probe.provider}_{probe.name}_semaphore"]
        assert [s.semaphore for s in probe.sites] == [semaphore] * len(probe.sites)
        offset = probe.semaphore_offset
        assert offset is not None and data[offset : offset + 2] == b"\0\0"
        assert probe.sites[0].location(str(path)) == (
            f"{path}:{probe.sites[0].pc_offset:#x}({offset:#x})"
        )
    probes_section = programs.readelf_section_address(path, ".probes")
    assert probes_section is not None
    assert {p.sites[0].semaphore for p in probes} == {probes_section, probes_section + 2}


def test_a_probe_without_a_semaphore_has_no_ref() -> None:
    (start,) = find_usdt(programs.demo(), "demo", "start")
    assert start.semaphore_offset is None
    assert "(" not in start.sites[0].location("/x")


@pytest.mark.parametrize("name", ["demo", "gated"])
def test_prelink_moved_notes_are_adjusted_by_the_stapsdt_base(tmp_path: Path, name: str) -> None:
    original = programs.demo(True, "-O2") if name == "demo" else programs.gated(True)
    moved = programs.prelinked_copy(original, tmp_path / "prelinked", -0x10000)
    base = programs.readelf_section_address(moved, ".stapsdt.base")
    assert base is not None
    assert {n.base for n in programs.readelf_notes(moved)} == {base + 0x10000}
    assert usdt_probes(moved) == usdt_probes(original)


def test_without_stapsdt_base_the_note_addresses_are_taken_as_they_are(tmp_path: Path) -> None:
    original = programs.gated(True)
    moved = programs.prelinked_copy(original, tmp_path / "nobase", 0x10, keep_base=False)
    before = {p.name: p.sites[0] for p in usdt_probes(original)}
    after = {p.name: p.sites[0] for p in usdt_probes(moved)}
    for name, site in before.items():
        assert after[name].pc == site.pc - 0x10
        assert after[name].pc_offset == site.pc_offset - 0x10
        assert after[name].semaphore_offset == site.semaphore_offset - 0x10  # type: ignore[operator]


def test_a_note_outside_the_code_is_an_error_naming_the_probe(tmp_path: Path) -> None:
    broken = programs.patch_notes(
        programs.gated(True),
        tmp_path / "broken",
        lambda name, pc, base, sem: (0x7FFF0000 if name == "hit" else pc, base, sem),
    )
    with pytest.raises(SymbolError) as caught:
        usdt_probes(broken)
    assert "USDT probe gated:hit" in caught.value.message
    assert "0x7fff0000 is not in an executable segment" in caught.value.message
    assert caught.value.hint is not None and "PT_LOAD" in caught.value.hint


def test_a_semaphore_in_code_is_an_error(tmp_path: Path) -> None:
    broken = programs.patch_notes(
        programs.gated(True),
        tmp_path / "broken",
        lambda name, pc, base, sem: (pc, base, pc if name == "always" else sem),
    )
    with pytest.raises(SymbolError) as caught:
        usdt_probes(broken)
    assert "USDT probe gated:always: its semaphore" in caught.value.message
    assert "is not in a writable data segment" in caught.value.message


def test_elfclass32_notes_have_four_byte_addresses() -> None:
    path = programs.i386()
    if path is None:
        pytest.skip("gcc here cannot build -m32 programs")
    image = ElfImage.from_path(path)
    assert not image.is_64bit
    probes = usdt_probes(path)
    _check_against_readelf(path, probes)
    (hit,) = probes
    assert hit.full_name == "p32:hit"
    assert all(a.fetcharg for a in hit.sites[0].args)


# ---- the system's own binaries -----------------------------------------------------------------

SYSTEM_FILES = [
    "/usr/bin/python3.11",
    "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/lib64/ld-linux-x86-64.so.2",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
]


@pytest.mark.parametrize("path", SYSTEM_FILES)
def test_system_binaries_agree_with_readelf(path: str) -> None:
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed here")
    real = Path(os.path.realpath(path))
    _check_against_readelf(real, usdt_probes(real))


def test_python_probes_all_have_semaphores() -> None:
    path = "/usr/bin/python3.11"
    if not os.path.exists(path):
        pytest.skip("python3.11 is not installed here")
    probes = usdt_probes(path)
    assert {p.provider for p in probes} == {"python"}
    assert {"function__entry", "function__return", "gc__start", "gc__done", "line"} <= {
        p.name for p in probes
    }
    assert all(p.semaphore_offset is not None for p in probes)
    (gc_start,) = find_usdt(path, "python", "gc__start")
    assert [a.fetcharg for a in gc_start.sites[0].args] == ["+112(%sp):s32"]


def test_libstdcxx_probes_are_found_by_library_name() -> None:
    try:
        library = locate_binary("stdc++")
    except SymbolError:
        pytest.skip("libstdc++ is not installed here")
    probes = find_usdt(library, "libstdcxx", "*")
    assert {p.name for p in probes} >= {"throw", "catch", "rethrow"}
    assert all(p.semaphore_offset is None for p in probes)


@pytest.mark.parametrize(
    "target, provider", [("/lib64/ld-linux-x86-64.so.2", "rtld"), ("c", "libc")]
)
def test_glibc_probes_when_glibc_has_them(target: str, provider: str) -> None:
    path = locate_binary(target)
    if not programs.readelf_notes(Path(os.path.realpath(path))):
        pytest.skip(f"{path}: this glibc was built without --enable-systemtap (readelf agrees)")
    probes = find_usdt(path, provider, "*")
    if provider == "rtld":  # what GDB's shared-library tracking relies on
        assert {"init_complete", "map_complete", "reloc_complete", "unmap_complete"} <= {
            p.name for p in probes
        }
    assert all(a.fetcharg for p in probes for s in p.sites for a in s.args)


# ---- lookup --------------------------------------------------------------------------------


def test_find_usdt_with_globs() -> None:
    path = programs.demo()
    assert [p.full_name for p in find_usdt(path, "hand", "*")] == [
        "hand:address",
        "hand:memory",
        "hand:refused",
        "hand:symbols",
        "hand:widths",
    ]
    assert [p.full_name for p in find_usdt(path, "*", "in*")] == [
        "demo:indexed",
        "demo:inlined",
        "demo:ints",
    ]


def test_no_match_lists_the_probes_and_suggests_the_closest() -> None:
    path = programs.gated()
    with pytest.raises(SymbolError) as caught:
        find_usdt(path, "gated", "hits")
    assert caught.value.message == f"no USDT probe gated:hits in {path}"
    assert caught.value.hint == "did you mean gated:hit? its probes: gated:always, gated:hit"


def test_dtrace_style_dashes_suggest_the_double_underscore_name() -> None:
    path = "/usr/bin/python3.11"
    if not os.path.exists(path):
        pytest.skip("python3.11 is not installed here")
    with pytest.raises(SymbolError) as caught:
        find_usdt(path, "python", "function-entry")
    assert caught.value.hint is not None
    assert caught.value.hint.startswith("did you mean python:function__entry")


def test_a_file_without_probes_says_so() -> None:
    with pytest.raises(SymbolError) as caught:
        find_usdt(locate_binary("c"), "*", "*")
    assert "has no USDT probes" in caught.value.message


def test_results_are_cached_until_the_file_changes(tmp_path: Path) -> None:
    copy = tmp_path / "gated"
    copy.write_bytes(programs.gated().read_bytes())
    first = usdt_probes(copy)
    assert usdt_probes(copy) == first
    programs.prelinked_copy(programs.gated(), tmp_path / "moved", 0x10, keep_base=False)
    os.replace(tmp_path / "moved", copy)
    assert usdt_probes(copy) != first
    clear_usdt_cache()
    assert usdt_probes(copy) == usdt_probes(copy)
