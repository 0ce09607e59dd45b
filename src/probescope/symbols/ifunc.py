"""IFUNC symbols: find the implementation a call really reaches, and the ones it could reach.

An STT_GNU_IFUNC symbol's value is a *resolver* that runs once, at relocation, and returns the
implementation for this CPU (glibc's `strlen` → `__strlen_avx2`, `__strlen_evex`, …). A uprobe
on the symbol's offset fires once per process, not per call. For tracefs the resolver's choice
is taken from probescope's own process: `dlsym` runs the same resolver on the same CPU for the
same file, and the returned address maps back to a file offset through `/proc/self/maps`
(mechanisms.md §6). A target started with other `GLIBC_TUNABLES` (hwcaps masks) may pick
another implementation; `ifunc_implementations` lists all candidates the resolver references.
"""

from __future__ import annotations

import os
from typing import Any

from probescope.errors import SymbolError
from probescope.symbols.function import FunctionSymbol
from probescope.symbols.insn import code_references, decode, disassembler, function_code
from probescope.symbols.maps import file_offset_of_address, mappings_of
from probescope.symbols.table import SymbolTable
from probescope.system.maps import Mapping, read_maps

RESOLVER_LIMIT = 4096  # bytes decoded when the resolver has no st_size
DT_FLAGS_1, DF_1_PIE = 0x6FFFFFFB, 0x08000000


def ifunc_implementations(
    function: FunctionSymbol, table: SymbolTable, path: str | None = None
) -> list[FunctionSymbol]:
    """Functions whose address the resolver of `function` materialises (its candidate results).

    Decodes the resolver (x86-64 `lea sym(%rip)`, aarch64 `adrp`+`add`) and keeps references
    that land exactly on a known function start. Empty when the machine is not decodable.
    """
    if disassembler(table.machine) is None:
        return []
    path = path or table.path
    limit = function.size or _bytes_to_next_function(function, table)
    code = function_code(path, table, function, limit)
    targets = code_references(decode(code, function.vaddr, table.machine), table.machine)
    found: dict[int, FunctionSymbol] = {}
    for vaddr in targets:
        offset = table.vaddr_to_offset(vaddr)
        if offset is None or offset == function.offset:
            continue
        candidate = table.function_at_offset(offset)
        if candidate is not None and candidate.offset == offset:
            found[offset] = candidate
    return [found[o] for o in sorted(found)]


def _bytes_to_next_function(function: FunctionSymbol, table: SymbolTable) -> int:
    later = [f.offset for f in table.functions if f.offset > function.offset]
    return min(
        min(later, default=function.offset + RESOLVER_LIMIT) - function.offset, RESOLVER_LIMIT
    )


def resolve_ifunc(
    path: str | os.PathLike[str],
    function: FunctionSymbol,
    table: SymbolTable | None = None,
    *,
    load: bool = True,
) -> FunctionSymbol:
    """The implementation `function` (an IFUNC of the library at `path`) resolves to here.

    Returns the FunctionSymbol starting at the chosen address when the table knows one (e.g.
    `__strlen_avx2` with libc's debug symbols), else a FunctionSymbol that keeps the IFUNC's
    name and version with the implementation's offset and vaddr (size 0, source `ifunc`).
    A library not yet loaded in probescope is `dlopen`ed (its constructors run) unless
    `load` is False. Raises SymbolError for executables (they cannot be dlopen'ed), for a
    library whose soname is already loaded from another file (two copies of one library in a
    process are unsafe), and when the resolver returns an address outside the library;
    the hint lists the implementations that can be probed instead.
    """
    if not function.is_ifunc:
        return function
    path = os.fspath(path)
    table = table or SymbolTable.for_path(path)
    handle = _dlopen(path, table, function, load)
    try:
        address = _dlsym(handle, function)
        if address is None:
            raise _unresolvable(function, table, f"dlsym found no {function.display_name!r}")
        return _function_at_address(address, function, table, path)
    finally:
        _dlclose(handle)


def _function_at_address(
    address: int, function: FunctionSymbol, table: SymbolTable, path: str
) -> FunctionSymbol:
    maps = read_maps("self")
    found = file_offset_of_address("self", address, maps)
    if found is None or not mappings_of("self", table.identity, [found[0]]):
        where = found[0].path if found is not None else _memory_at(address, maps)
        raise _unresolvable(
            function,
            table,
            f"its resolver returned {address:#x}, which lies in {where}, not in {path}",
        )
    _, offset = found
    implementation = table.function_at_offset(offset)
    if implementation is not None and implementation.offset == offset:
        return implementation
    vaddr = table.offset_to_vaddr(offset)
    return FunctionSymbol(
        name=function.name,
        version=function.version,
        is_default_version=function.is_default_version,
        aliases=(),
        vaddr=offset if vaddr is None else vaddr,
        size=0,
        offset=offset,
        binding=function.binding,
        is_ifunc=False,
        source="ifunc",
    )


def _memory_at(address: int, maps: list[Mapping]) -> str:
    """What lies at an address outside every file: `the vDSO` (where glibc's time and
    gettimeofday resolve: calls never reach the library), or anonymous memory."""
    for mapping in maps:
        if mapping.start <= address < mapping.end:
            if mapping.path == "[vdso]":
                return "the vDSO (calls never reach the library)"
            return mapping.path or "anonymous memory"
    return "an unmapped address"


def _libdl() -> Any:
    import ctypes

    libc = ctypes.CDLL(None)
    for name in ("dlsym", "dlvsym"):
        getattr(libc, name).restype = ctypes.c_void_p
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    libc.dlopen.restype = ctypes.c_void_p
    libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.dlclose.argtypes = [ctypes.c_void_p]
    libc.dlerror.restype = ctypes.c_char_p
    return libc


def _dlopen(path: str, table: SymbolTable, function: FunctionSymbol, load: bool) -> int:
    """A dlopen handle (one reference, to be dlclose'd) for `path` in probescope's process."""
    libdl = _libdl()
    lazy_noload = os.RTLD_LAZY | os.RTLD_NOLOAD
    handle = libdl.dlopen(os.fsencode(path), lazy_noload)
    if handle:
        return int(handle)
    if mappings_of("self", table.identity, read_maps("self")):
        raise _unresolvable(function, table, "the file is mapped here but not as a library")
    from probescope.symbols.elfimage import ET_EXEC, ElfImage

    with ElfImage.from_path(path) as image:
        soname = image.soname
        flags_1 = next((value for tag, value in image.dynamic() if tag == DT_FLAGS_1), 0)
        is_executable = image.type == ET_EXEC or bool(flags_1 & DF_1_PIE)
    if is_executable:
        raise _unresolvable(
            function, table, f"{path} is an executable and cannot be loaded to run its resolver"
        )
    if soname:
        other = libdl.dlopen(soname.encode(), lazy_noload)
        if other:
            libdl.dlclose(other)
            raise _unresolvable(
                function,
                table,
                f"another file with soname {soname} is already loaded in probescope; "
                "loading a second copy is unsafe",
            )
    if not load:
        raise _unresolvable(function, table, f"{path} is not loaded in probescope")
    handle = libdl.dlopen(os.fsencode(path), os.RTLD_LAZY | os.RTLD_LOCAL)
    if not handle:
        error = libdl.dlerror() or b"unknown error"
        raise _unresolvable(function, table, f"dlopen failed: {error.decode('utf-8', 'replace')}")
    return int(handle)


def _dlsym(handle: int, function: FunctionSymbol) -> int | None:
    libdl = _libdl()
    name = function.name.encode()
    if function.version is not None:
        address = libdl.dlvsym(handle, name, function.version.encode())
    else:
        address = libdl.dlsym(handle, name)
    return int(address) if address else None


def _dlclose(handle: int) -> None:
    _libdl().dlclose(handle)


def _unresolvable(function: FunctionSymbol, table: SymbolTable, reason: str) -> SymbolError:
    try:
        candidates = ifunc_implementations(function, table)
    except SymbolError:
        candidates = []
    listing = ", ".join(f"{c.display_name} ({c.offset:#x})" for c in candidates[:12])
    hint = (
        f"probe its implementations instead: {listing}"
        if listing
        else "probe the implementation by name or file offset (the resolver itself runs once)"
    )
    return SymbolError(
        f"cannot resolve IFUNC {function.display_name} of {table.path}: {reason}", hint=hint
    )
