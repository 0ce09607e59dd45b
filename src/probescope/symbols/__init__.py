"""Turns names into places: binaries, ELF symbols, debug info and uprobe file offsets.

The public API, by job:
- find the file: `locate_binary(target, pid=None)`;
- list and look up functions: `SymbolTable.for_path(path)` → `.functions`, `.lookup(name)`,
  `.match(glob)`, `.function_at_offset(offset)` (cached on disk by file identity);
- check a probe site: `check_probe_offset(path, offset, function)`;
- IFUNCs: `resolve_ifunc(path, function)`, `ifunc_implementations(function, table)`;
- processes: `read_maps(pid)`, `runtime_address(pid, file, offset)`,
  `file_offset_of_address(pid, address)`;
- files: `file_identity(path)`, `ElfImage.from_path(path)` (`.build_id`, `.notes()`, ...).
"""

from probescope.symbols.elfimage import ElfImage
from probescope.symbols.function import FunctionSymbol
from probescope.symbols.identity import FileIdentity, file_identity
from probescope.symbols.ifunc import ifunc_implementations, resolve_ifunc
from probescope.symbols.insn import check_probe_offset
from probescope.symbols.locate import locate_binary
from probescope.symbols.maps import (
    Mapping,
    file_offset_of_address,
    read_maps,
    runtime_address,
    runtime_addresses,
)
from probescope.symbols.table import SymbolTable

__all__ = [
    "ElfImage",
    "FileIdentity",
    "FunctionSymbol",
    "Mapping",
    "SymbolTable",
    "check_probe_offset",
    "file_identity",
    "file_offset_of_address",
    "ifunc_implementations",
    "locate_binary",
    "read_maps",
    "resolve_ifunc",
    "runtime_address",
    "runtime_addresses",
]
