"""CallFrameTable: a binary's DWARF call-frame information (`.eh_frame`, `.debug_frame`), row by
row — how to find the caller's frame from any instruction, with or without frame pointers.

pyelftools decodes the entries. Parsing every entry of a large binary costs seconds (python3.11
has ~10,000), so for `.eh_frame` the binary-search table of `.eh_frame_hdr` finds the one FDE
that covers an address and only that FDE is parsed and decoded, once. Without that table (or for
`.debug_frame`) the whole section is parsed on first use.

A row says, for addresses [start, end): the CFA (canonical frame address: the caller's stack
pointer) as `register + offset` or a DWARF expression, and for each saved register a rule
(`offset`: saved at CFA + N; `val_offset`: its value is CFA + N; `same`; `undefined`;
`register`: held in another register). DWARF register numbers are the ABI's (x86-64: 0 rax,
1 rdx, 2 rcx, 3 rbx, 4 rsi, 5 rdi, 6 rbp, 7 rsp, 8..15 r8..r15, 16 the return address).
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from probescope.errors import SymbolError
from probescope.symbols.identity import FileIdentity, file_identity

_TABLES: dict[tuple[int, int, int], CallFrameTable] = {}

# .eh_frame_hdr pointer encodings (DW_EH_PE_*) this reader decodes.
_PE_OMIT = 0xFF
_PE_FORMATS = {0x03: ("I", 4), 0x0B: ("i", 4), 0x04: ("Q", 8), 0x0C: ("q", 8), 0x02: ("H", 2)}
_PE_PCREL = 0x10
_PE_DATAREL = 0x30


class CfiRow(NamedTuple):
    """How to unwind from any address in [start, end) (link-time addresses)."""

    start: int
    end: int
    cfa_register: int | None
    cfa_offset: int
    cfa_expression: tuple[tuple[str, tuple[int, ...]], ...] | None
    registers: tuple[tuple[int, str, int], ...]  # (DWARF register, rule, argument)

    def rule(self, register: int) -> tuple[str, int] | None:
        for number, kind, argument in self.registers:
            if number == register:
                return kind, argument
        return None


_RULE_KINDS = {
    "OFFSET": "offset",
    "VAL_OFFSET": "val_offset",
    "SAME_VALUE": "same",
    "UNDEFINED": "undefined",
    "REGISTER": "register",
}


@dataclass
class _Fde:
    start: int
    end: int
    rows: list[CfiRow] = field(default_factory=list)


class CallFrameTable:
    """The call-frame rows of one ELF file. Build with `CallFrameTable.for_path(path)`."""

    def __init__(self, stream: IO[bytes], *, name: str = "<stream>") -> None:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        self.name = name
        self._stream = stream
        try:
            self._elf = ELFFile(stream)
        except ELFError as error:
            raise SymbolError(f"{name}: not an ELF file ({error})") from None
        self._eh_frame = self._elf.get_section_by_name(".eh_frame")
        self._debug_frame = self._elf.get_section_by_name(".debug_frame")
        self._index: list[tuple[int, int]] | None = None  # (initial location, FDE offset)
        self._fdes: dict[int, _Fde | None] = {}
        self._all: list[_Fde] | None = None
        self._cfi: Any = None
        self._debug_cfi: Any = None
        self._rows: dict[int, CfiRow | None] = {}

    @classmethod
    def for_path(cls, path: str | os.PathLike[str]) -> CallFrameTable:
        """The table of the file at `path`, kept for the life of the process."""
        identity: FileIdentity = file_identity(path)
        key = (identity.device, identity.inode, identity.mtime_ns)
        table = _TABLES.get(key)
        if table is None:
            try:
                stream = open(path, "rb")  # noqa: SIM115 - kept open while the table lives
            except OSError as error:
                raise SymbolError(f"cannot read {os.fspath(path)!r}: {error.strerror}") from None
            table = cls(stream, name=os.fspath(path))
            _TABLES[key] = table
        return table

    @property
    def has_frame_info(self) -> bool:
        return self._eh_frame is not None or self._debug_frame is not None

    def row_at(self, vaddr: int) -> CfiRow | None:
        """The row covering link-time address `vaddr`, or None when no FDE covers it."""
        if vaddr in self._rows:
            return self._rows[vaddr]
        fde = self._fde_at(vaddr)
        row = None
        if fde is not None and fde.rows:
            starts = [r.start for r in fde.rows]
            position = bisect.bisect_right(starts, vaddr) - 1
            if position >= 0:
                row = fde.rows[position]
        if len(self._rows) < 200_000:
            self._rows[vaddr] = row
        return row

    # -- finding the FDE ------------------------------------------------------------------

    def _fde_at(self, vaddr: int) -> _Fde | None:
        if self._eh_frame is not None:
            index = self._hdr_index()
            if index is not None:
                position = bisect.bisect_right(index, (vaddr, 1 << 64)) - 1
                if position >= 0:
                    fde = self._fde_from_eh_frame(index[position][1])
                    if fde is not None and fde.start <= vaddr < fde.end:
                        return fde
            else:
                found = self._scan(vaddr, self._all_eh_frame())
                if found is not None:
                    return found
        if self._debug_frame is not None:
            return self._scan(vaddr, self._all_debug_frame())
        return None

    @staticmethod
    def _scan(vaddr: int, fdes: list[_Fde]) -> _Fde | None:
        starts = [f.start for f in fdes]
        position = bisect.bisect_right(starts, vaddr) - 1
        while position >= 0:
            fde = fdes[position]
            if fde.start <= vaddr < fde.end:
                return fde
            if fde.end <= vaddr:
                break
            position -= 1
        return None

    def _hdr_index(self) -> list[tuple[int, int]] | None:
        if self._index is not None:
            return self._index or None
        self._index = []
        header = self._elf.get_section_by_name(".eh_frame_hdr")
        if header is None or self._eh_frame is None:
            return None
        data = header.data()
        base = header["sh_addr"]
        if len(data) < 4 or data[0] != 1:
            return None
        pointer_encoding, count_encoding, table_encoding = data[1], data[2], data[3]
        position = 4
        try:
            _, position = _read_encoded(data, position, pointer_encoding, base)
            count, position = _read_encoded(data, position, count_encoding, base)
        except SymbolError:
            return None
        if table_encoding == _PE_OMIT or (table_encoding & 0x0F) not in _PE_FORMATS:
            return None
        eh_address = self._eh_frame["sh_addr"]
        entries = []
        try:
            for _ in range(count):
                location, position = _read_encoded(data, position, table_encoding, base)
                address, position = _read_encoded(data, position, table_encoding, base)
                entries.append((location, address - eh_address))
        except SymbolError:
            return None
        entries.sort()
        self._index = entries
        return entries

    def _eh_cfi(self) -> Any:
        if self._cfi is None:
            from elftools.dwarf.callframe import CallFrameInfo

            dwarf = self._elf.get_dwarf_info(follow_links=False)
            section = dwarf.eh_frame_sec
            assert section is not None  # only called when the file has .eh_frame
            self._cfi = CallFrameInfo(
                stream=section.stream,
                size=section.size,
                address=section.address,
                base_structs=dwarf.structs,
                for_eh_frame=True,
            )
        return self._cfi

    def _fde_from_eh_frame(self, offset: int) -> _Fde | None:
        if offset in self._fdes:
            return self._fdes[offset]
        fde = None
        try:
            entry = self._eh_cfi()._parse_entry_at(offset)
            fde = _decoded(entry)
        except Exception:  # a malformed entry unwinds like no entry
            fde = None
        self._fdes[offset] = fde
        return fde

    def _all_eh_frame(self) -> list[_Fde]:
        if self._all is None:
            self._all = _decode_all(self._eh_cfi().get_entries())
        return self._all

    def _all_debug_frame(self) -> list[_Fde]:
        if self._debug_cfi is None:
            dwarf = self._elf.get_dwarf_info(follow_links=False)
            self._debug_cfi = _decode_all(dwarf.CFI_entries()) if dwarf.has_CFI() else []
        result: list[_Fde] = self._debug_cfi
        return result

    def close(self) -> None:
        self._stream.close()


def _decode_all(entries: list[Any]) -> list[_Fde]:
    fdes = []
    for entry in entries:
        if type(entry).__name__ != "FDE":
            continue
        try:
            fde = _decoded(entry)
        except Exception:
            continue
        if fde is not None:
            fdes.append(fde)
    fdes.sort(key=lambda f: f.start)
    return fdes


def _decoded(entry: Any) -> _Fde | None:
    if type(entry).__name__ != "FDE":
        return None
    start = entry["initial_location"]
    end = start + entry["address_range"]
    table = entry.get_decoded().table
    rows: list[CfiRow] = []
    for number, line in enumerate(table):
        row_end = table[number + 1]["pc"] if number + 1 < len(table) else end
        cfa = line["cfa"]
        expression = _expression(cfa.expr) if cfa.expr else None
        registers = []
        for register, rule in line.items():
            if not isinstance(register, int):
                continue
            kind = _RULE_KINDS.get(rule.type)
            if kind is None:
                kind = "expression"
            argument = rule.arg if isinstance(rule.arg, int) else 0
            registers.append((register, kind, argument))
        rows.append(
            CfiRow(
                line["pc"],
                row_end,
                cfa.reg,
                cfa.offset or 0,
                expression,
                tuple(registers),
            )
        )
    return _Fde(start, end, rows)


def _expression(raw: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A CFA expression as (operation name, operands) pairs."""
    from elftools.dwarf.dwarf_expr import DWARFExprParser
    from elftools.dwarf.structs import DWARFStructs

    structs = DWARFStructs(little_endian=True, dwarf_format=32, address_size=8)
    parsed = DWARFExprParser(structs).parse_expr(list(raw))
    return tuple((op.op_name, tuple(int(a) for a in op.args)) for op in parsed)


def _read_encoded(data: bytes, position: int, encoding: int, base: int) -> tuple[int, int]:
    """One DW_EH_PE_* encoded pointer of .eh_frame_hdr; `base` is the section's address."""
    if encoding == _PE_OMIT:
        return 0, position
    form = _PE_FORMATS.get(encoding & 0x0F)
    if form is None:
        raise SymbolError(f"unsupported pointer encoding {encoding:#x} in .eh_frame_hdr")
    code, size = form
    if position + size > len(data):
        raise SymbolError(".eh_frame_hdr is truncated")
    (value,) = struct.unpack_from("<" + code, data, position)
    application = encoding & 0x70
    if application == _PE_PCREL:
        value += base + position
    elif application == _PE_DATAREL:
        value += base
    elif application:
        raise SymbolError(f"unsupported pointer application {application:#x} in .eh_frame_hdr")
    return value, position + size
