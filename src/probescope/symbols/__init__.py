"""Turns names into places: binaries, ELF symbols, debug info and uprobe file offsets.

The public API, by job:
- find the file: `locate_binary(target, pid=None)`;
- list and look up functions: `SymbolTable.for_path(path)` → `.functions`, `.lookup(name)`,
  `.match(glob)`, `.function_at_offset(offset)` (cached on disk by file identity);
- check a probe site: `check_probe_offset(path, offset, function)`;
- IFUNCs: `resolve_ifunc(path, function)`, `ifunc_implementations(function, table)`;
- processes (their maps are system/maps.py's): `mappings_of(pid, file)`,
  `runtime_address(pid, file, offset)`, `file_offset_of_address(pid, address)`;
- files: `file_identity(path)`, `ElfImage.from_path(path)` (`.build_id`, `.notes()`, ...);
- what a user-space tracer needs of the binaries of a process (linker.py: the dynamic linker's
  rendezvous; unwinder.py: the exception unwinder's entry points; `SymbolTable.is_go`).

Submodules load on first use, so `import probescope.symbols` stays cheap for the hot path
(a cached table lookup) that needs only the table and its cache.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probescope.symbols.elfimage import ElfImage
    from probescope.symbols.function import FunctionSymbol
    from probescope.symbols.identity import FileIdentity, file_identity
    from probescope.symbols.ifunc import ifunc_implementations, resolve_ifunc
    from probescope.symbols.insn import check_probe_offset
    from probescope.symbols.locate import locate_binary
    from probescope.symbols.maps import (
        file_offset_of_address,
        mappings_of,
        runtime_address,
        runtime_addresses,
    )
    from probescope.symbols.table import SymbolTable

_HOMES = {
    "ElfImage": "elfimage",
    "FunctionSymbol": "function",
    "FileIdentity": "identity",
    "file_identity": "identity",
    "ifunc_implementations": "ifunc",
    "resolve_ifunc": "ifunc",
    "check_probe_offset": "insn",
    "locate_binary": "locate",
    "file_offset_of_address": "maps",
    "mappings_of": "maps",
    "runtime_address": "maps",
    "runtime_addresses": "maps",
    "SymbolTable": "table",
    "find_usdt": "usdt",
    "usdt_probes": "usdt",
    "UsdtProbe": "usdt",
    "UsdtSite": "usdt",
    "UsdtArg": "usdt_arguments",
}

__all__ = [
    "ElfImage",
    "FileIdentity",
    "FunctionSymbol",
    "SymbolTable",
    "UsdtArg",
    "UsdtProbe",
    "UsdtSite",
    "check_probe_offset",
    "file_identity",
    "file_offset_of_address",
    "find_usdt",
    "ifunc_implementations",
    "locate_binary",
    "mappings_of",
    "resolve_ifunc",
    "runtime_address",
    "runtime_addresses",
    "usdt_probes",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'probescope.symbols' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"probescope.symbols.{home}"), name)
    globals()[name] = value
    return value
