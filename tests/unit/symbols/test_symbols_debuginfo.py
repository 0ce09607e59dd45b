"""Stripped binaries get their symbols back: build-id trees, .gnu_debuglink (CRC), MiniDebugInfo."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probescope.errors import SymbolError
from probescope.symbols.debuginfo import debug_info_hint, find_debug_symbols
from probescope.symbols.elfimage import ElfImage
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs


def _unstripped(name: str) -> SymbolTable:
    """The same link before stripping: stripping must not move code."""
    table = SymbolTable.for_path(programs.unstripped_twin(name), debug_dirs=[])
    assert "symtab" in table.sources
    return table


def test_build_id_debug_file(tmp_path: Path) -> None:
    binary, debug_file = programs.stripped_with_build_id()
    root = programs.build_id_tree(tmp_path / "debug", binary, debug_file)
    table = SymbolTable.for_path(binary, debug_dirs=[str(root)])
    assert table.sources == ("build-id",)
    assert not table.stripped
    build_id = programs.read_build_id(binary)
    assert table.debug_file == str(root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug")
    expected = _unstripped("psbuildid")
    for name in ("main", "ps_add", "ps_static_helper"):
        function = table.lookup(name)
        assert function.offset == expected.lookup(name).offset
        assert function.source == "build-id"


def test_build_id_file_with_another_build_id_is_rejected(tmp_path: Path) -> None:
    binary, _ = programs.stripped_with_build_id()
    _, other_debug = programs.stripped_with_debuglink()
    root = programs.build_id_tree(tmp_path / "debug", binary, other_debug)
    table = SymbolTable.for_path(binary, debug_dirs=[str(root)])
    assert table.stripped
    assert any("build-id" in note and "differs" in note for note in table.debug_notes)


def test_debuginfod_client_cache_is_searched(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    binary, debug_file = programs.stripped_with_build_id()
    build_id = programs.read_build_id(binary)
    cache = tmp_path / "debuginfod"
    (cache / build_id).mkdir(parents=True)
    shutil.copyfile(debug_file, cache / build_id / "debuginfo")
    monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(cache))
    table = SymbolTable.for_path(binary, debug_dirs=[str(tmp_path / "none")])
    assert table.debug_file == str(cache / build_id / "debuginfo")
    assert table.lookup("ps_add").source == "build-id"


def test_debuglink_in_the_same_directory() -> None:
    binary, debug_file = programs.stripped_with_debuglink()
    table = SymbolTable.for_path(binary, debug_dirs=[])
    assert table.sources == ("debuglink",)
    assert table.debug_file == str(debug_file)
    helper = table.lookup("ps_static_helper")
    assert helper.source == "debuglink"
    assert helper.offset == _unstripped("psdebuglink").lookup("ps_static_helper").offset


@pytest.mark.parametrize("layout", ["dot-debug", "debug-dir"])
def test_debuglink_search_directories(tmp_path: Path, layout: str) -> None:
    binary, debug_file = programs.stripped_with_debuglink()
    directory = tmp_path / "bin"
    directory.mkdir()
    copy = directory / binary.name
    shutil.copyfile(binary, copy)
    debug_root = tmp_path / "debugroot"
    if layout == "dot-debug":
        place = directory / ".debug" / debug_file.name
    else:
        place = Path(f"{debug_root}{directory}") / debug_file.name
    place.parent.mkdir(parents=True)
    shutil.copyfile(debug_file, place)
    table = SymbolTable.for_path(copy, debug_dirs=[str(debug_root)])
    assert table.debug_file == str(place)
    assert table.lookup("ps_add").offset == _unstripped("psdebuglink").lookup("ps_add").offset


def test_debuglink_with_wrong_crc_is_rejected(tmp_path: Path) -> None:
    binary, debug_file = programs.stripped_with_debuglink()
    copy = tmp_path / binary.name
    shutil.copyfile(binary, copy)
    corrupt = bytearray(debug_file.read_bytes())
    corrupt[-1] ^= 0xFF
    (tmp_path / debug_file.name).write_bytes(bytes(corrupt))
    table = SymbolTable.for_path(copy, debug_dirs=[])
    assert table.stripped
    assert any("CRC32" in note for note in table.debug_notes)
    with pytest.raises(SymbolError) as error:
        table.lookup("ps_add")
    assert "CRC32" in (error.value.hint or "")


def test_minidebuginfo() -> None:
    binary = programs.minidebuginfo()
    with ElfImage.from_path(binary) as image:
        assert image.symtab is None and image.section(".gnu_debugdata") is not None
    table = SymbolTable.for_path(binary, debug_dirs=[])
    assert table.sources == ("dynsym", "minidebuginfo")
    helper = table.lookup("ps_static_helper")  # local: only in .gnu_debugdata
    assert helper.source == "minidebuginfo" and helper.binding == "local"
    add = table.lookup("ps_add")  # exported with -rdynamic: from .dynsym
    assert add.source == "dynsym"
    reference = _unstripped("psminidebug")
    assert reference.lookup("ps_static_helper").offset == helper.offset
    assert reference.lookup("ps_add").offset == add.offset
    assert {f.offset for f in reference.functions} == {f.offset for f in table.functions}


def test_corrupt_minidebuginfo_is_an_error(tmp_path: Path) -> None:
    binary = programs.minidebuginfo()
    data = bytearray(binary.read_bytes())
    with ElfImage.from_path(binary) as image:
        section = image.section(".gnu_debugdata")
        assert section is not None
    data[section.offset + 8 : section.offset + 24] = bytes(16)
    broken = tmp_path / "broken"
    broken.write_bytes(bytes(data))
    with pytest.raises(SymbolError, match="MiniDebugInfo"):
        SymbolTable.for_path(broken, debug_dirs=[])


def test_search_reports_every_candidate(tmp_path: Path) -> None:
    binary, _ = programs.stripped_with_debuglink()
    with ElfImage.from_path(binary) as image:
        search = find_debug_symbols(image, str(binary), [str(tmp_path)])
    assert search.found is not None and search.found.kind == "debuglink"
    build_id = programs.read_build_id(binary)
    assert f"{tmp_path}/.build-id/{build_id[:2]}/{build_id[2:]}.debug" in search.checked


def test_hint_names_the_debian_debug_package() -> None:
    hint = debug_info_hint("/bin/bash", "abcdef")
    assert "bash-dbgsym" in hint
    assert "debuginfod-find debuginfo abcdef" in hint
    assert "libc6-dbg" in debug_info_hint("/usr/lib/x86_64-linux-gnu/libc.so.6", None)
