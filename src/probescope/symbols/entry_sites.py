"""EntrySites: what patching a function's entry needs to know about one binary.

The fentry engine turns function entries into jumps. It needs, per file: the entries compiled
as nops for that purpose (`__patchable_function_entries` from `-fpatchable-function-entry`, or
`__mcount_loc` from `-pg -mfentry -mnop-mcount -mrecord-mcount`), every symbol that starts
inside code (a jump must not cover the start of another symbol), the function table (for
`.cold` parts and sizes) and the code bytes themselves, all as file offsets.
"""

from __future__ import annotations

import bisect
import os
import struct

from probescope.errors import SymbolError
from probescope.symbols.elfimage import ElfImage
from probescope.symbols.function import FunctionSymbol
from probescope.symbols.identity import FileIdentity, file_identity
from probescope.symbols.table import SymbolTable

_NOP_SECTIONS = ("__patchable_function_entries", "__mcount_loc")
_STT_SECTION, _STT_FILE = 3, 4
_MEMO: dict[tuple[str, FileIdentity], EntrySites] = {}


class EntrySites:
    """Entry facts of one ELF file (build with `EntrySites.for_path`)."""

    def __init__(
        self,
        path: str,
        identity: FileIdentity,
        table: SymbolTable,
        nop_entries: frozenset[int],
        symbol_starts: dict[int, str],
        is_go: bool,
    ) -> None:
        self.path = path
        self.identity = identity
        self.table = table
        self.nop_entries = nop_entries
        self._starts = sorted(symbol_starts)
        self._names = symbol_starts
        self.is_go = is_go
        self._cold: dict[str, list[FunctionSymbol]] | None = None
        self._bytes: bytes | None = None

    @classmethod
    def for_path(cls, path: str | os.PathLike[str]) -> EntrySites:
        """The facts of the file at `path` (kept in memory while the file is unchanged)."""
        path = os.fspath(path)
        identity = file_identity(path)
        known = _MEMO.get((path, identity))
        if known is not None:
            return known
        table = SymbolTable.for_path(path)
        try:
            image = ElfImage.from_path(path)
        except OSError as error:
            raise SymbolError(f"cannot read {path!r}: {error.strerror}") from None
        with image:
            nops = _nop_entries(image)
            starts = _symbol_starts(image)
            is_go = any(
                image.section(name) is not None for name in (".go.buildinfo", ".note.go.buildid")
            )
        sites = cls(path, identity, table, nops, starts, is_go)
        _MEMO[(path, identity)] = sites
        return sites

    def code(self, offset: int, size: int) -> bytes:
        """`size` bytes of the file from `offset` (fewer at the end of the file)."""
        if self._bytes is None:
            with open(self.path, "rb") as stream:
                self._bytes = stream.read()
        return self._bytes[offset : offset + size]

    def vaddr(self, offset: int) -> int:
        """The link-time address of file `offset` (for decoding branch targets)."""
        value = self.table.offset_to_vaddr(offset)
        if value is None:
            raise SymbolError(f"file offset {offset:#x} of {self.path} is not in a PT_LOAD")
        return value

    def symbols_inside(self, start: int, end: int) -> list[tuple[int, str]]:
        """(offset, name) of every symbol starting strictly between `start` and `end`."""
        first = bisect.bisect_right(self._starts, start)
        last = bisect.bisect_left(self._starts, end)
        return [(offset, self._names[offset]) for offset in self._starts[first:last]]

    def cold_parts(self, function: FunctionSymbol) -> list[FunctionSymbol]:
        """`NAME.cold` / `NAME.cold.N`: the parts gcc split off a function (they may jump back
        into it)."""
        if self._cold is None:
            self._cold = {}
            for candidate in self.table.functions:
                base, dot, rest = candidate.name.partition(".cold")
                if dot and (not rest or rest.startswith(".")):
                    self._cold.setdefault(base, []).append(candidate)
        return self._cold.get(function.name, [])


def _nop_entries(image: ElfImage) -> frozenset[int]:
    found: set[int] = set()
    for name in _NOP_SECTIONS:
        section = image.section(name)
        if section is None:
            continue
        data = image.section_data(section)
        for (vaddr,) in struct.iter_unpack("<Q", data[: len(data) & ~7]):
            offset = image.vaddr_to_offset(vaddr, executable=True)
            if offset is not None:
                found.add(offset)
    return frozenset(found)


def _symbol_starts(image: ElfImage) -> dict[int, str]:
    starts: dict[int, str] = {}
    for section in (image.symtab, image.dynsym):
        if section is None:
            continue
        for symbol in image.symbols(section):
            if not symbol.value or not symbol.shndx or symbol.type in (_STT_SECTION, _STT_FILE):
                continue
            if symbol.shndx >= 0xFF00:  # SHN_ABS, SHN_COMMON...
                continue
            offset = image.vaddr_to_offset(symbol.value, executable=True)
            if offset is not None and symbol.name:
                starts.setdefault(offset, symbol.name)
    return starts
