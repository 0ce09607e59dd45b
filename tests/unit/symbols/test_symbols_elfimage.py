"""ElfImage against pyelftools on real files: headers, sections, segments, symbols, notes."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerSymSection
from elftools.elf.sections import NoteSection, SymbolTableSection

from probescope.errors import SymbolError
from probescope.symbols.elfimage import (
    ET_DYN,
    ET_EXEC,
    STT_FUNC,
    STT_GNU_IFUNC,
    ElfImage,
)
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
SYSTEM_FILES = [LIBC, "/bin/bash", "/usr/bin/python3.11"]


def _files() -> list[Path]:
    return [
        programs.demo(pie=True),
        programs.demo(pie=False, optimize="-O2"),
        programs.versioned_library(),
        programs.minidebuginfo(),
        programs.stripped_with_debuglink()[0],
        *[Path(p) for p in SYSTEM_FILES if Path(p).exists()],
    ]


@pytest.fixture(scope="module", params=range(8), ids=lambda i: f"file{i}")
def pair(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    files = _files()
    if request.param >= len(files):
        pytest.skip("system file missing")
    path = files[request.param]
    data = path.read_bytes()
    with ElfImage.from_path(path) as image:
        yield path, image, ELFFile(io.BytesIO(data))


def test_header_matches_pyelftools(pair) -> None:  # type: ignore[no-untyped-def]
    _, image, reference = pair
    assert image.type == {"ET_EXEC": ET_EXEC, "ET_DYN": ET_DYN}[reference.header.e_type]
    assert image.machine == 62  # EM_X86_64
    assert image.is_64bit == (reference.elfclass == 64)
    assert image.entry == reference.header.e_entry


def test_sections_match_pyelftools(pair) -> None:  # type: ignore[no-untyped-def]
    _, image, reference = pair
    expected = [
        (s.name, s.header.sh_type, s.header.sh_addr, s.header.sh_offset, s.header.sh_size)
        for s in reference.iter_sections()
    ]
    actual = [(s.name, s.type, s.addr, s.offset, s.size) for s in image.sections]
    assert [a[0] for a in actual] == [e[0] for e in expected]
    assert [a[2:] for a in actual] == [e[2:] for e in expected]


def test_segments_match_pyelftools(pair) -> None:  # type: ignore[no-untyped-def]
    _, image, reference = pair
    expected = [
        (s.header.p_flags, s.header.p_offset, s.header.p_vaddr, s.header.p_filesz, s.header.p_memsz)
        for s in reference.iter_segments()
    ]
    assert [(s.flags, s.offset, s.vaddr, s.filesz, s.memsz) for s in image.segments] == expected


def test_function_symbols_match_pyelftools(pair) -> None:  # type: ignore[no-untyped-def]
    _, image, reference = pair
    for section in reference.iter_sections():
        if not isinstance(section, SymbolTableSection):
            continue
        expected = [
            (s.name, s["st_value"], s["st_size"], s["st_shndx"])
            for s in section.iter_symbols()
            if s["st_info"]["type"] in ("STT_FUNC", "STT_LOOS")
            and s["st_shndx"] != "SHN_UNDEF"
            and s["st_value"] != 0
        ]
        ours = image.function_symbols(image.section(section.name))  # type: ignore[arg-type]
        actual = [(s.name, s.value, s.size, s.shndx) for s in ours]
        normalized = [(n, v, z, x if isinstance(x, int) else None) for n, v, z, x in expected]
        assert [(n, v, z) for n, v, z, _ in actual] == [(n, v, z) for n, v, z, _ in normalized]
        assert all(s.type in (STT_FUNC, STT_GNU_IFUNC) for s in ours)
        everything = list(image.symbols(image.section(section.name)))  # type: ignore[arg-type]
        assert len(everything) == section.num_symbols()


def test_symbol_versions_match_pyelftools(pair) -> None:  # type: ignore[no-untyped-def]
    _, image, reference = pair
    versym = next((s for s in reference.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    versions = image.symbol_versions()
    if versym is None:
        assert versions is None
        return
    assert versions is not None
    verdef = reference.get_section_by_name(".gnu.version_d")
    defined = {}
    if verdef is not None:
        for entry, aux in verdef.iter_versions():
            if not entry["vd_flags"] & 1:  # VER_FLG_BASE
                defined[entry["vd_ndx"]] = next(aux).name
    dynsym = reference.get_section_by_name(".dynsym")
    for number, symbol in enumerate(dynsym.iter_symbols()):
        ndx = versym.get_symbol(number)["ndx"]
        index = ndx if isinstance(ndx, int) else {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}[ndx]
        expected_name = defined.get(index & 0x7FFF)
        if symbol["st_shndx"] == "SHN_UNDEF":
            continue
        assert versions[number].name == expected_name, symbol.name


def test_build_id_and_debuglink_match_readelf(pair) -> None:  # type: ignore[no-untyped-def]
    path, image, reference = pair
    notes = [
        n
        for s in reference.iter_sections()
        if isinstance(s, NoteSection)
        for n in s.iter_notes()
        if n["n_type"] == "NT_GNU_BUILD_ID"
    ]
    if notes:
        assert image.build_id == notes[0]["n_desc"] == programs.read_build_id(path)
    else:
        assert image.build_id is None
    link = reference.get_section_by_name(".gnu_debuglink")
    if link is None:
        assert image.debuglink is None
    else:
        data = link.data()
        name = data[: data.index(b"\0")].decode()
        assert image.debuglink == (name, struct.unpack_from("<I", data, len(data) - 4)[0])


def test_versioned_library_versions() -> None:
    with ElfImage.from_path(programs.versioned_library()) as image:
        assert image.soname is None or image.soname.startswith("libpsvers")
        versions = image.symbol_versions()
        assert versions is not None
        assert image.dynsym is not None
        by_value = {
            (s.name, s.value): versions[s.number] for s in image.function_symbols(image.dynsym)
        }
        nm = programs.nm_addresses(programs.versioned_library(), dynamic=True)
        assert by_value[("ps_versioned", nm["ps_versioned@VERS_1"])] == ("VERS_1", True)
        assert by_value[("ps_versioned", nm["ps_versioned@@VERS_2"])] == ("VERS_2", False)


def test_vaddr_and_offset_translation_uses_pt_load() -> None:
    with ElfImage.from_path(programs.demo(pie=False)) as image:
        text = image.section(".text")
        assert text is not None
        assert image.vaddr_to_offset(text.addr, executable=True) == text.offset
        assert image.offset_to_vaddr(text.offset) == text.addr
        assert text.addr != text.offset  # ET_EXEC: linked at 0x400000
        data = image.section(".data")
        assert data is not None
        assert image.vaddr_to_offset(data.addr, executable=True) is None


def test_notes_include_gnu_property_and_build_id() -> None:
    with ElfImage.from_path(programs.demo()) as image:
        names = {(note.name, note.type) for note in image.notes()}
        assert ("GNU", 3) in names


def test_elffile_gives_pyelftools_view() -> None:
    with ElfImage.from_path(programs.demo()) as image:
        assert image.elffile().get_section_by_name(".text") is not None


def test_from_bytes_and_stream(tmp_path: Path) -> None:
    data = programs.demo().read_bytes()
    image = ElfImage.from_bytes(data, name="memory")
    assert image.section(".text") is not None
    with open(programs.demo(), "rb") as stream:
        assert ElfImage(stream).sections == image.sections


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: b"MZ" + d[2:], "bad magic"),
        (lambda d: d[:40], "truncated ELF header|section header table"),
        (lambda d: d[:4] + b"\x07" + d[5:], "unknown ELF class"),
        (lambda d: d[:0x28] + struct.pack("<Q", len(d) + 100) + d[0x30:], "section header table"),
    ],
    ids=["magic", "truncated", "class", "shoff"],
)
def test_malformed_files_raise_symbol_error(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = mutate(programs.demo().read_bytes())
    with pytest.raises(SymbolError, match=message):
        ElfImage.from_bytes(data, name="bad")


def test_symbol_table_beyond_the_file_raises() -> None:
    data = bytearray(programs.demo().read_bytes())
    image = ElfImage.from_bytes(bytes(data))
    symtab = image.symtab
    assert symtab is not None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<Q", data, shoff + symtab.number * 64 + 32, len(data) * 2)  # sh_size
    broken = ElfImage.from_bytes(bytes(data), name="broken")
    with pytest.raises(SymbolError, match="truncated"):
        broken.function_symbols(broken.sections[symtab.number])


def test_unreadable_path_raises() -> None:
    with pytest.raises(SymbolError, match="cannot read"):
        ElfImage.from_path("/nonexistent/file")


def test_non_ascii_symbol_names_decode_as_pyelftools_does() -> None:
    """A string table that is not ASCII takes the byte-slicing path; names come out as UTF-8."""
    from support.build import compile_program

    binary = compile_program(
        "int café(int x) { return x + 1; }\n"
        "int naïve_größe(int x) { return x * 2; }\n"
        "int main(int argc, char **argv) { return café(argc) + naïve_größe(argc); }\n",
        "utf8_names",
    )
    image = ElfImage.from_path(binary)
    symtab = image.symtab
    assert symtab is not None
    ours = {s.name: s.value for s in image.function_symbols(symtab)}
    with open(binary, "rb") as stream:
        section = ELFFile(stream).get_section_by_name(".symtab")
        expected = {
            s.name: s["st_value"]
            for s in section.iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
        }
    assert "café" in ours and "naïve_größe" in ours
    assert ours == expected


@pytest.mark.parametrize("beyond", [0, 1, 1000])
def test_a_function_named_beyond_its_string_table_raises(beyond: int) -> None:
    data = bytearray(programs.demo().read_bytes())
    image = ElfImage.from_bytes(bytes(data))
    symtab = image.symtab
    assert symtab is not None
    strings = image.sections[symtab.link]
    victim = image.function_symbols(symtab)[0].number
    struct.pack_into("<I", data, symtab.offset + victim * 24, strings.size + beyond)  # st_name
    broken = ElfImage.from_bytes(bytes(data), name="broken")
    with pytest.raises(SymbolError, match=f"symbol {victim} of '.symtab' has a name beyond"):
        broken.function_symbols(broken.sections[symtab.number])
