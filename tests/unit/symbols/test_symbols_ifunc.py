"""IFUNCs: the implementations a resolver can return, and the one dlsym picks on this machine."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from probescope.errors import SymbolError
from probescope.symbols.ifunc import ifunc_implementations, resolve_ifunc
from probescope.symbols.maps import runtime_address
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def test_library_ifunc_implementations_come_from_the_resolver_code() -> None:
    library = programs.versioned_library()
    table = SymbolTable.for_path(library)
    dispatch = table.lookup("ps_dispatch")
    names = [f.name for f in ifunc_implementations(dispatch, table)]
    assert names == ["ps_impl_slow", "ps_impl_fast"]


def test_library_ifunc_resolves_to_what_the_resolver_returns() -> None:
    library = programs.versioned_library()
    table = SymbolTable.for_path(library)
    chosen = resolve_ifunc(library, table.lookup("ps_dispatch"), table)
    assert chosen.name == "ps_impl_fast"  # ps_prefer_slow is 0
    assert not chosen.is_ifunc
    loaded = ctypes.CDLL(str(library))
    assert loaded.ps_dispatch(1) == 201  # the same implementation, called


def test_non_ifunc_is_returned_unchanged() -> None:
    table = SymbolTable.for_path(LIBC)
    malloc = table.lookup("malloc")
    assert resolve_ifunc(LIBC, malloc, table) is malloc


def test_libc_strlen_resolves_to_the_address_dlsym_returns() -> None:
    table = SymbolTable.for_path(LIBC)
    strlen = table.lookup("strlen")
    assert strlen.is_ifunc
    chosen = resolve_ifunc(LIBC, strlen, table)
    address = ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value
    assert runtime_address(os.getpid(), LIBC, chosen.offset) == address
    if "build-id" in table.sources:
        assert chosen.name.startswith("__strlen_")
        assert chosen in ifunc_implementations(strlen, table)
        assert {"__strlen_sse2", "__strlen_avx2", "__strlen_evex"} <= {
            f.name for f in ifunc_implementations(strlen, table)
        }
    else:
        assert chosen.source == "ifunc" and chosen.name == "strlen"


def test_versioned_ifunc_uses_dlvsym() -> None:
    table = SymbolTable.for_path(LIBC)
    memcpy = table.lookup("memcpy@@GLIBC_2.14")
    chosen = resolve_ifunc(LIBC, memcpy, table)
    address = ctypes.cast(ctypes.CDLL(None).memcpy, ctypes.c_void_p).value
    assert runtime_address(os.getpid(), LIBC, chosen.offset) == address


def test_executable_ifunc_cannot_be_resolved_but_lists_implementations() -> None:
    binary = programs.ifunc_program()
    table = SymbolTable.for_path(binary)
    dispatch = table.lookup("ps_dispatch")
    assert dispatch.is_ifunc
    with pytest.raises(SymbolError, match="executable") as error:
        resolve_ifunc(binary, dispatch, table)
    hint = error.value.hint or ""
    assert "ps_impl_slow" in hint and "ps_impl_fast" in hint


def test_not_loading_is_respected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    copy = tmp_path / "libpscopy.so"
    copy.write_bytes(programs.versioned_library().read_bytes())
    table = SymbolTable.for_path(copy)
    with pytest.raises(SymbolError, match="not loaded"):
        resolve_ifunc(copy, table.lookup("ps_dispatch"), table, load=False)


def test_a_second_copy_of_a_loaded_soname_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    copy = tmp_path / "libc.so.6"
    copy.write_bytes(Path(LIBC).read_bytes())
    table = SymbolTable.for_path(copy)
    with pytest.raises(SymbolError, match="already loaded"):
        resolve_ifunc(copy, table.lookup("strlen"), table)


def test_a_glob_skips_an_ifunc_it_cannot_resolve_with_a_note() -> None:
    """An executable's IFUNC cannot be resolved in probescope (it cannot be dlopen'ed): a glob
    over the program probes everything else and says what it left out; the name alone fails."""
    from probescope.errors import SpecError
    from probescope.symbols.resolve import resolve_specs

    program = programs.ifunc_program()
    notes: list[str] = []
    probes = resolve_specs([f"{program}:ps_*"], notes=notes)
    names = {p.symbol for p in probes}
    assert "ps_dispatch" not in names and {"ps_impl_slow", "ps_impl_fast"} <= names
    assert len(notes) == 1
    assert "skipped 1 IFUNC" in notes[0] and "ps_dispatch" in notes[0]
    assert "is an executable" in notes[0]
    with pytest.raises(SpecError, match="cannot resolve IFUNC ps_dispatch"):
        resolve_specs([f"{program}:ps_dispatch"])


def test_libc_glob_resolves_in_spite_of_its_unresolvable_ifuncs() -> None:
    """`c:*` once failed whole on one IFUNC; glibc's time() resolves into the vDSO."""
    from probescope.symbols.resolve import resolve_specs

    notes: list[str] = []
    probes = resolve_specs(["c:*"], notes=notes)
    assert len(probes) > 1000
    for note in notes:  # which IFUNCs cannot be had depends on this libc and CPU
        assert note.startswith("c:*: skipped ") and "IFUNC" in note
