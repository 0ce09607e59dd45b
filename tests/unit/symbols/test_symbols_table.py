"""SymbolTable on compiled and system binaries: offsets, versions, aliases, ambiguity, lookups."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from probescope.errors import SymbolError
from probescope.symbols.elfimage import ElfImage
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
PYTHON = "/usr/bin/python3.11"
BASH = "/bin/bash"


def _section_offset(reference: ELFFile, vaddr: int) -> int | None:
    """libbpf's rule, independent of PT_LOAD arithmetic: st_value − sh_addr + sh_offset."""
    for section in reference.iter_sections():
        header = section.header
        if header.sh_addr and header.sh_addr <= vaddr < header.sh_addr + header.sh_size:
            if header.sh_type == "SHT_NOBITS":
                return None
            return vaddr - header.sh_addr + header.sh_offset
    return None


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda: programs.demo(pie=True, optimize="-O0"), id="pie-O0"),
        pytest.param(lambda: programs.demo(pie=True, optimize="-O2"), id="pie-O2"),
        pytest.param(lambda: programs.demo(pie=False, optimize="-O0"), id="exec-O0"),
        pytest.param(lambda: programs.demo(pie=False, optimize="-O2"), id="exec-O2"),
        pytest.param(programs.versioned_library, id="shared"),
        pytest.param(lambda: Path(LIBC), id="libc"),
        pytest.param(lambda: Path(PYTHON), id="python3.11"),
        pytest.param(lambda: Path(BASH), id="bash"),
    ],
)
def test_every_offset_matches_the_section_rule_and_bytes(path) -> None:  # type: ignore[no-untyped-def]
    binary = path()
    if not binary.exists():
        pytest.skip(f"{binary} missing")
    table = SymbolTable.for_path(binary)
    reference = ELFFile(io.BytesIO(binary.read_bytes()))
    assert table.functions
    offsets = [f.offset for f in table.functions]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == len(offsets)  # aliases collapsed: one entry per address
    for function in table.functions:
        assert function.offset == _section_offset(reference, function.vaddr), function


def test_non_pie_offsets_differ_from_vaddrs() -> None:
    table = SymbolTable.for_path(programs.demo(pie=False))
    function = table.lookup("ps_add")
    assert table.type_name == "ET_EXEC"
    assert function.vaddr >= 0x400000
    assert function.offset == function.vaddr - 0x400000
    assert function.offset != function.vaddr


def test_python_is_et_exec_and_offsets_come_from_its_text_segment() -> None:
    table = SymbolTable.for_path(PYTHON)
    function = table.lookup("Py_BytesMain")
    segment = table.load_for_offset(function.offset)
    assert table.type_name == "ET_EXEC"
    assert segment is not None and segment.executable
    assert function.offset == function.vaddr - segment.vaddr + segment.offset
    assert function.offset != function.vaddr


def test_lookup_matches_nm() -> None:
    binary = programs.demo()
    table = SymbolTable.for_path(binary)
    nm = programs.nm_addresses(binary)
    for name in ("main", "ps_add", "ps_static_helper", "ps_measure"):
        assert table.lookup(name).vaddr == nm[name]


def test_aliases_collapse_into_one_entry() -> None:
    table = SymbolTable.for_path(programs.demo())
    target = table.lookup("ps_alias_target")
    assert table.lookup("ps_alias") is target
    assert table.lookup("ps_weak_alias") is target
    assert {target.name, *target.aliases} == {"ps_alias_target", "ps_alias", "ps_weak_alias"}
    assert target.binding == "global"


def test_static_functions_are_local() -> None:
    function = SymbolTable.for_path(programs.demo()).lookup("ps_static_helper")
    assert function.binding == "local"
    assert function.source == "symtab"


def test_versioned_symbols_of_a_shared_library() -> None:
    library = programs.versioned_library()
    table = SymbolTable.for_path(library)
    nm = programs.nm_addresses(library, dynamic=True)
    default = table.lookup("ps_versioned")
    old = table.lookup("ps_versioned@VERS_1")
    assert default.vaddr == nm["ps_versioned@@VERS_2"]
    assert old.vaddr == nm["ps_versioned@VERS_1"]
    assert (default.version, default.is_default_version) == ("VERS_2", True)
    assert (old.version, old.is_default_version) == ("VERS_1", False)
    assert default.display_name == "ps_versioned@@VERS_2"
    assert table.lookup("ps_versioned@@VERS_2") is default
    assert table.lookup("ps_versioned@VERS_2") is default  # `@` accepts the default too
    assert "ps_new_impl" in default.aliases  # the .symtab name of the same code
    assert table.lookup("ps_old_impl") is old
    with pytest.raises(SymbolError, match=r"no function 'ps_versioned@@VERS_1'") as error:
        table.lookup("ps_versioned@@VERS_1")
    assert "ps_versioned@VERS_1" in (error.value.hint or "")
    assert "ps_versioned@@VERS_2" in (error.value.hint or "")
    with pytest.raises(SymbolError):
        table.lookup("ps_versioned@VERS_3")


def test_libc_versions_and_default_preference() -> None:
    table = SymbolTable.for_path(LIBC)
    memcpy = table.lookup("memcpy")
    assert memcpy.version == "GLIBC_2.14" and memcpy.is_default_version and memcpy.is_ifunc
    old = table.lookup("memcpy@GLIBC_2.2.5")
    assert old.offset != memcpy.offset and not old.is_default_version
    realpath = table.lookup("realpath")
    assert realpath.display_name == "realpath@@GLIBC_2.3"
    malloc = table.lookup("malloc")
    assert malloc.name == "malloc" and malloc.version == "GLIBC_2.2.5"
    assert table.lookup("__libc_malloc") is malloc


def test_libc_uses_its_build_id_debug_file_when_installed() -> None:
    with ElfImage.from_path(LIBC) as image:
        build_id = image.build_id
    assert build_id is not None
    debug = Path(f"/usr/lib/debug/.build-id/{build_id[:2]}/{build_id[2:]}.debug")
    table = SymbolTable.for_path(LIBC)
    if not debug.exists():
        assert table.sources == ("dynsym",)
        pytest.skip("libc6-dbg is not installed")
    assert table.sources == ("dynsym", "build-id")
    assert table.debug_file == str(debug)
    avx2 = table.lookup("__strlen_avx2")
    assert avx2.binding == "local" and avx2.source == "build-id"


def test_ifunc_is_marked() -> None:
    library = programs.versioned_library()
    dispatch = SymbolTable.for_path(library).lookup("ps_dispatch")
    assert dispatch.is_ifunc and dispatch.kind == "ifunc"
    assert "ps_resolve" in dispatch.aliases  # the resolver's own local name, same address


def test_ambiguous_names_list_candidates_with_offsets() -> None:
    binary = programs.duplicates()
    table = SymbolTable.for_path(binary)
    with pytest.raises(SymbolError, match="ambiguous") as error:
        table.lookup("ps_dup")
    add, helper = table.lookup("ps_add"), table.lookup("ps_static_helper")
    assert f"{add.offset:#x}" in error.value.message
    assert f"{helper.offset:#x}" in error.value.message
    assert {f.offset for f in table.match("ps_dup")} == {add.offset, helper.offset}


def test_non_weak_definition_wins_over_weak() -> None:
    table = SymbolTable.for_path(programs.duplicates())
    assert table.lookup("ps_pref").offset == table.lookup("ps_static_helper").offset


def test_not_found_suggests_close_names() -> None:
    table = SymbolTable.for_path(programs.demo())
    with pytest.raises(SymbolError, match="no function 'ps_ad'") as error:
        table.lookup("ps_ad")
    assert "ps_add" in (error.value.hint or "")


def test_data_symbols_are_named_as_such() -> None:
    table = SymbolTable.for_path(programs.demo())
    with pytest.raises(SymbolError, match="data object, not a function"):
        table.lookup("ps_global_counter")


def test_stripped_binary_without_debug_info_says_how_to_get_it(tmp_path: Path) -> None:
    binary, _ = programs.stripped_with_build_id()
    table = SymbolTable.for_path(binary, debug_dirs=[str(tmp_path)])
    assert table.stripped
    with pytest.raises(SymbolError, match="stripped") as error:
        table.lookup("ps_add")
    hint = error.value.hint or ""
    assert "debuginfod" in hint and "-g" in hint


def test_match_globs() -> None:
    table = SymbolTable.for_path(programs.demo())
    names = {name for f in table.match("ps_*") for name in f.names}
    assert {"ps_add", "ps_static_helper", "ps_measure", "ps_alias_target", "ps_alias"} <= names
    assert [f.name for f in table.match("ps_add")] == ["ps_add"]
    assert table.match("nothing_like_this*") == []
    library = SymbolTable.for_path(programs.versioned_library())
    assert len(library.match("ps_versioned")) == 1
    assert len(library.match("ps_versioned*")) == 2
    assert [f.version for f in library.match("ps_versioned@VERS_1*")] == ["VERS_1"]


def test_function_at_offset() -> None:
    table = SymbolTable.for_path(programs.demo())
    add = table.lookup("ps_add")
    assert table.function_at_offset(add.offset) is add
    assert table.function_at_offset(add.offset + add.size - 1) is add
    after = table.function_at_offset(add.offset + add.size)
    assert after is not add
    assert table.function_at_offset(0) is None


def test_relocatable_objects_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "x.c"
    source.write_text("int f(void) { return 1; }\n")
    import subprocess

    subprocess.run(["gcc", "-c", "-o", str(tmp_path / "x.o"), str(source)], check=True)
    with pytest.raises(SymbolError, match="ET_REL"):
        SymbolTable.for_path(tmp_path / "x.o")


def test_debug_files_are_refused_as_targets(tmp_path: Path) -> None:
    _, debug_file = programs.stripped_with_build_id()
    with pytest.raises(SymbolError, match="separate debug file"):
        SymbolTable.for_path(debug_file)
