"""What the ptrace engine learns about binaries through symbols/: the dynamic linker's rendezvous
(checked against where this process's own ld.so and executable put it), the unwinder's entry
points (against dlsym), whether Go linked a file, and the probe-site check for a probe that
names its function by offset only."""

from __future__ import annotations

import ctypes
import os

import pytest

from probescope.errors import SymbolError
from probescope.symbols.elfimage import EM_X86_64
from probescope.symbols.insn import check_probe_site, decode
from probescope.symbols.linker import dt_debug, rendezvous_symbols
from probescope.symbols.maps import file_offset_of_address, mappings_of
from probescope.symbols.table import SymbolTable
from probescope.symbols.unwinder import (
    CATCH,
    ENTRY_POINTS,
    UNWIND,
    may_hold_unwinder,
    unwinder_entry_points,
)
from probescope.system.maps import read_maps
from probescope.system.procfs import AT_PHDR, AT_PHNUM, read_auxv
from support.build import compile_program
from unit.symbols import symbol_programs as programs

LD_SO = "/lib64/ld-linux-x86-64.so.2"
LIBGCC = "/lib/x86_64-linux-gnu/libgcc_s.so.1"
LIBSTDCXX = "/lib/x86_64-linux-gnu/libstdc++.so.6"


def _address(library: str, name: str) -> int:
    value = ctypes.cast(getattr(ctypes.CDLL(library), name), ctypes.c_void_p).value
    assert value is not None
    return value


def _load_base(path: str) -> int:
    return min(m.start for m in mappings_of("self", path) if m.offset == 0)


def test_rendezvous_symbols_of_ld_so_are_where_this_process_has_them() -> None:
    found = rendezvous_symbols(LD_SO)
    assert found is not None and found.r_debug is not None
    base = _load_base(LD_SO)
    r_debug = ctypes.addressof(ctypes.c_int.in_dll(ctypes.CDLL(None), "_r_debug"))
    assert base + found.r_debug == r_debug
    # struct r_debug {int r_version; struct link_map *r_map; ElfW(Addr) r_brk; ...}
    assert base + found.r_brk == ctypes.c_uint64.from_address(r_debug + 16).value


def test_no_rendezvous_symbols_in_other_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert rendezvous_symbols(programs.demo()) is None
    (tmp_path / "text").write_text("not an ELF file\n")
    assert rendezvous_symbols(tmp_path / "text") is None
    assert rendezvous_symbols(tmp_path / "missing") is None


def test_dt_debug_of_this_process_points_at_r_debug() -> None:
    auxv = read_auxv(os.getpid())
    reads: list[tuple[int, int]] = []

    def read(address: int, size: int) -> bytes:
        reads.append((address, size))
        return ctypes.string_at(address, size)

    found = dt_debug(read, auxv[AT_PHDR], auxv[AT_PHNUM])
    assert found == ctypes.addressof(ctypes.c_int.in_dll(ctypes.CDLL(None), "_r_debug"))
    assert reads[0] == (auxv[AT_PHDR], auxv[AT_PHNUM] * 56)
    assert dt_debug(lambda address, size: None, auxv[AT_PHDR], auxv[AT_PHNUM]) is None


def test_unwinder_entry_points_of_libgcc_are_what_dlsym_finds() -> None:
    found = unwinder_entry_points(LIBGCC)
    ctypes.CDLL(LIBGCC)
    maps = read_maps("self")
    expected = []
    for name in ("_Unwind_ForcedUnwind", "_Unwind_RaiseException", "_Unwind_Resume"):
        located = file_offset_of_address("self", _address(LIBGCC, name), maps)
        assert located is not None
        expected.append((UNWIND, located[1]))
    assert set(expected) <= set(found)
    assert {role for role, _ in found} == {UNWIND}  # __cxa_begin_catch is libstdc++'s
    if os.path.exists(LIBSTDCXX):
        catch = [offset for role, offset in unwinder_entry_points(LIBSTDCXX) if role == CATCH]
        table = SymbolTable.for_path(LIBSTDCXX)
        assert catch == [table.lookup("__cxa_begin_catch").offset]


def test_only_unwinder_libraries_and_the_executable_are_worth_reading() -> None:
    assert may_hold_unwinder(LIBGCC, False) and may_hold_unwinder("/x/libstdc++.so.6", False)
    assert not may_hold_unwinder("/usr/lib/x86_64-linux-gnu/libc.so.6", False)
    assert may_hold_unwinder("/usr/bin/prog", True)
    assert set(ENTRY_POINTS.values()) == {UNWIND, CATCH}
    assert unwinder_entry_points(programs.demo()) == []  # a C program without libgcc_eh
    assert unwinder_entry_points("/nonexistent") == []


GO_LOOKALIKE = r"""
__attribute__((used, section(".go.buildinfo"))) static const char buildinfo[32] =
    "\xff Go buildinf:";
__attribute__((noinline)) int work(int x) { return x + 1; }
int main(int argc, char **argv) { (void)argv; return work(argc) - 2; }
"""


def test_a_file_with_go_build_info_is_a_go_binary() -> None:
    go = compile_program(GO_LOOKALIKE, "go_lookalike")
    table = SymbolTable.for_path(go, use_cache=False)
    assert table.is_go
    assert SymbolTable.for_path(go).is_go and SymbolTable.for_path(go).is_go  # cached too
    assert not SymbolTable.for_path(programs.demo()).is_go


def test_check_probe_site_finds_the_function_by_its_offset() -> None:
    binary = programs.demo(pie=True, optimize="-O0")
    function = SymbolTable.for_path(binary).lookup("ps_add")
    code = binary.read_bytes()[function.offset : function.end_offset]
    long_one = next(i for i in decode(code, function.vaddr, EM_X86_64) if i.size > 1)
    inside = function.offset + long_one.address - function.vaddr + 1
    check_probe_site(binary, function.offset, function.offset)
    check_probe_site(binary, function.offset)
    check_probe_site(binary, inside - 1, function.offset)
    with pytest.raises(SymbolError, match="inside the instruction at"):
        check_probe_site(binary, inside, function.offset)
    with pytest.raises(SymbolError, match="inside the instruction at"):
        check_probe_site(binary, inside, function.offset + 1)  # no function starts there
