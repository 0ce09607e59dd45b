"""ElfImage: a bounds-checked `struct` reader of an ELF file's headers, symbols, versions, notes.

pyelftools is the reference for ELF structure, but importing it alone costs ≈ 40 ms and walking
libc's symbols with it ≈ 60 ms, while this reader lists them in about a millisecond. Resolving a
symbol is on the start-up path of every probe, so the hot path reads the few structures it needs
(file header, program and section headers, symbol tables, `.gnu.version*`, notes, `.dynamic`)
directly; `elffile()` hands out a pyelftools `ELFFile` over the same bytes for everything else
(DWARF). Every read is checked against the file size and fails with a SymbolError.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from probescope.errors import SymbolError
from probescope.symbols.segment import PT_DYNAMIC, PT_LOAD, PT_NOTE, Segment

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"

ET_REL, ET_EXEC, ET_DYN, ET_CORE = 1, 2, 3, 4
ELF_TYPE_NAMES = {ET_REL: "ET_REL", ET_EXEC: "ET_EXEC", ET_DYN: "ET_DYN", ET_CORE: "ET_CORE"}

EM_386, EM_ARM, EM_X86_64, EM_AARCH64, EM_RISCV = 3, 40, 62, 183, 243
MACHINE_NAMES = {
    EM_386: "i386",
    EM_ARM: "arm",
    EM_X86_64: "x86_64",
    EM_AARCH64: "aarch64",
    EM_RISCV: "riscv",
}

SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 0, 2, 3, 7, 8, 11
SHT_GNU_VERDEF, SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFF
SHN_UNDEF, SHN_ABS, SHN_XINDEX = 0, 0xFFF1, 0xFFFF
SHF_COMPRESSED = 0x800

STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 0, 1, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 0, 1, 2, 10
BINDING_NAMES = {
    STB_LOCAL: "local",
    STB_GLOBAL: "global",
    STB_WEAK: "weak",
    STB_GNU_UNIQUE: "unique",
}

VER_NDX_LOCAL, VER_NDX_GLOBAL = 0, 1
VERSYM_HIDDEN = 0x8000
VER_FLG_BASE = 0x1

NT_GNU_BUILD_ID = 3
DT_NULL, DT_NEEDED, DT_SONAME = 0, 1, 14


# st_info → 1 for STT_FUNC and STT_GNU_IFUNC (low nibble 2 or 10), else 0
_FUNCTION_TYPES = bytes(
    1 if value & 0xF in (STT_FUNC, STT_GNU_IFUNC) else 0 for value in range(256)
)


class Section(NamedTuple):
    """One section header, with its name resolved from `.shstrtab`."""

    number: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int


class ElfSymbol(NamedTuple):
    """One entry of `.symtab`/`.dynsym`; `number` is its index (the key into `.gnu.version`)."""

    name: str
    value: int
    size: int
    bind: int
    type: int
    other: int
    shndx: int
    number: int


class Note(NamedTuple):
    """One ELF note: owner name (without the NUL), type and descriptor bytes."""

    name: str
    type: int
    desc: bytes
    offset: int  # file offset of the descriptor


class SymbolVersion(NamedTuple):
    """The version of one `.dynsym` entry: `name` is None for unversioned/base symbols."""

    name: str | None
    hidden: bool


_FORMATS = {
    # class, data -> (ehdr tail, shdr, phdr, sym, dyn) struct formats
    (2, "<"): ("<HHIQQQIHHHHHH", "<IIQQQQIIQQ", "<IIQQQQQQ", "<IBBHQQ", "<qQ"),
    (2, ">"): (">HHIQQQIHHHHHH", ">IIQQQQIIQQ", ">IIQQQQQQ", ">IBBHQQ", ">qQ"),
    (1, "<"): ("<HHIIIIIHHHHHH", "<IIIIIIIIII", "<IIIIIIII", "<IIIBBH", "<iI"),
    (1, ">"): (">HHIIIIIHHHHHH", ">IIIIIIIIII", ">IIIIIIII", ">IIIBBH", ">iI"),
}


class ElfImage:
    """The parsed headers of one ELF file held in memory (an mmap for real files).

    `ElfImage(stream)` reads a binary stream; `ElfImage.from_path(path)` opens a file;
    `ElfImage.from_bytes(data)` wraps bytes (the MiniDebugInfo ELF inside `.gnu_debugdata`).
    """

    def __init__(self, stream: IO[bytes], *, name: str | None = None) -> None:
        self.name: str = name or str(getattr(stream, "name", "<stream>"))
        data: bytes | mmap.mmap
        try:
            data = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, AttributeError):
            stream.seek(0)
            data = stream.read()
        self._load(data)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> ElfImage:
        try:
            with open(path, "rb") as stream:
                return cls(stream, name=str(path))
        except OSError as error:
            raise SymbolError(
                f"cannot read {str(path)!r}: {error.strerror}",
                hint="check the path and that you may read the file",
            ) from None

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str = "<bytes>") -> ElfImage:
        image = cls.__new__(cls)
        image.name = name
        image._load(data)
        return image

    def _load(self, data: bytes | mmap.mmap) -> None:
        self._data = data
        self.size = len(data)
        self._require(self.size >= 16 and data[:4] == ELF_MAGIC, "not an ELF file (bad magic)")
        elf_class, elf_data = data[4], data[5]
        self._require(elf_class in (1, 2), f"unknown ELF class {elf_class}")
        self._require(elf_data in (1, 2), f"unknown ELF data encoding {elf_data}")
        self.elf_class = elf_class
        self.is_64bit = elf_class == 2
        self.endian = "<" if elf_data == 1 else ">"
        ehdr, self._shdr, self._phdr, self._sym, self._dyn = _FORMATS[(elf_class, self.endian)]
        self._require(self.size >= 16 + struct.calcsize(ehdr), "truncated ELF header")
        (
            self.type,
            self.machine,
            _version,
            self.entry,
            phoff,
            shoff,
            self.flags,
            _ehsize,
            phentsize,
            phnum,
            shentsize,
            shnum,
            shstrndx,
        ) = struct.unpack_from(ehdr, data, 16)
        self._sym_size = struct.calcsize(self._sym)
        self.sections = self._read_sections(shoff, shentsize, shnum, shstrndx)
        if phnum == 0xFFFF and self.sections:
            phnum = self.sections[0].info
        self.segments = self._read_segments(phoff, phentsize, phnum)
        self.loads = tuple(s for s in self.segments if s.type == PT_LOAD)
        self._by_name: dict[str, Section] = {}
        for section in self.sections:
            self._by_name.setdefault(section.name, section)

    # ---- bounds -------------------------------------------------------------------------

    def _require(self, condition: bool, what: str) -> None:
        if not condition:
            raise SymbolError(
                f"{self.name}: malformed ELF file: {what}",
                hint="the file may be truncated or not an executable/shared library",
            )

    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes at file `offset` (checked against the file size)."""
        self._require(
            offset >= 0 and size >= 0 and offset + size <= self.size,
            f"read of {size} bytes at offset {offset:#x} is beyond the end of the file",
        )
        return bytes(self._data[offset : offset + size])

    # ---- headers ------------------------------------------------------------------------

    def _read_sections(
        self, shoff: int, shentsize: int, shnum: int, shstrndx: int
    ) -> tuple[Section, ...]:
        if shoff == 0:
            return ()
        size = struct.calcsize(self._shdr)
        self._require(shentsize >= size, f"section header size {shentsize} is too small")
        self._require(shoff + shentsize <= self.size, "section header table is beyond the end")
        raw0 = struct.unpack_from(self._shdr, self._data, shoff)
        if shnum == 0:
            shnum = raw0[5]  # sh_size of section 0 holds the real count (e_shnum overflow)
        if shstrndx == SHN_XINDEX:
            shstrndx = raw0[6]
        self._require(shoff + shentsize * shnum <= self.size, "section header table is truncated")
        raw = [
            struct.unpack_from(self._shdr, self._data, shoff + i * shentsize) for i in range(shnum)
        ]
        names = b""
        if 0 < shstrndx < shnum:
            _, _, _, _, str_off, str_size, *_ = raw[shstrndx]
            self._require(str_off + str_size <= self.size, "section name table is beyond the end")
            names = bytes(self._data[str_off : str_off + str_size])
        sections = []
        for index, (
            name,
            stype,
            flags,
            addr,
            offset,
            size_,
            link,
            info,
            align,
            entsize,
        ) in enumerate(raw):
            end = names.find(b"\0", name)
            text = names[name:end].decode("utf-8", "replace") if 0 <= name < len(names) else ""
            sections.append(
                Section(index, text, stype, flags, addr, offset, size_, link, info, align, entsize)
            )
        return tuple(sections)

    def _read_segments(self, phoff: int, phentsize: int, phnum: int) -> tuple[Segment, ...]:
        if phoff == 0 or phnum == 0:
            return ()
        size = struct.calcsize(self._phdr)
        self._require(phentsize >= size, f"program header size {phentsize} is too small")
        self._require(phoff + phentsize * phnum <= self.size, "program header table is truncated")
        segments = []
        for i in range(phnum):
            fields = struct.unpack_from(self._phdr, self._data, phoff + i * phentsize)
            if self.is_64bit:
                ptype, flags, offset, vaddr, _paddr, filesz, memsz, align = fields
            else:
                ptype, offset, vaddr, _paddr, filesz, memsz, flags, align = fields
            segments.append(Segment(ptype, flags, offset, vaddr, filesz, memsz, align))
        return tuple(segments)

    @property
    def type_name(self) -> str:
        return ELF_TYPE_NAMES.get(self.type, f"type {self.type}")

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"machine {self.machine}")

    def section(self, name: str) -> Section | None:
        return self._by_name.get(name)

    def section_data(self, section: Section) -> bytes:
        """The bytes of `section` (empty for SHT_NOBITS)."""
        if section.type == SHT_NOBITS or section.size == 0:
            return b""
        self._require(
            section.offset + section.size <= self.size,
            f"section {section.name!r} ({section.size} bytes at {section.offset:#x}) is truncated",
        )
        return bytes(self._data[section.offset : section.offset + section.size])

    def _string(self, table: bytes, offset: int) -> str:
        self._require(
            0 <= offset < len(table) or offset == 0, f"string offset {offset:#x} out of range"
        )
        end = table.find(b"\0", offset)
        return table[offset : end if end >= 0 else len(table)].decode("utf-8", "surrogateescape")

    # ---- address arithmetic ---------------------------------------------------------------

    def load_for_vaddr(self, vaddr: int) -> Segment | None:
        """The PT_LOAD whose file-backed part holds `vaddr`."""
        for segment in self.loads:
            if segment.contains_vaddr(vaddr):
                return segment
        return None

    def load_for_offset(self, offset: int) -> Segment | None:
        """The PT_LOAD whose file range holds file `offset`."""
        for segment in self.loads:
            if segment.contains_offset(offset):
                return segment
        return None

    def vaddr_to_offset(self, vaddr: int, *, executable: bool = False) -> int | None:
        """File offset of link-time `vaddr` (through its PT_LOAD), or None."""
        segment = self.load_for_vaddr(vaddr)
        if segment is None or (executable and not segment.executable):
            return None
        return vaddr - segment.vaddr + segment.offset

    def offset_to_vaddr(self, offset: int) -> int | None:
        segment = self.load_for_offset(offset)
        return None if segment is None else offset - segment.offset + segment.vaddr

    # ---- symbols --------------------------------------------------------------------------

    @property
    def symtab(self) -> Section | None:
        return next((s for s in self.sections if s.type == SHT_SYMTAB), None)

    @property
    def dynsym(self) -> Section | None:
        return next((s for s in self.sections if s.type == SHT_DYNSYM), None)

    def _symbol_bytes(self, section: Section) -> tuple[bytes, bytes]:
        self._require(
            section.type in (SHT_SYMTAB, SHT_DYNSYM), f"{section.name!r} is not a symbol table"
        )
        self._require(
            0 < section.link < len(self.sections), f"{section.name!r} has no string table"
        )
        data = self.section_data(section)
        strings = self.section_data(self.sections[section.link])
        usable = len(data) - len(data) % self._sym_size
        return data[:usable], strings

    def symbols(self, section: Section) -> Iterator[ElfSymbol]:
        """Every entry of a symbol table, in table order (index 0, the null symbol, included)."""
        data, strings = self._symbol_bytes(section)
        for index, fields in enumerate(struct.iter_unpack(self._sym, data)):
            name, info, other, shndx, value, size = self._symbol_fields(fields)
            yield ElfSymbol(
                self._string(strings, name), value, size, info >> 4, info & 0xF, other, shndx, index
            )

    def _symbol_fields(self, fields: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
        if self.is_64bit:
            name, info, other, shndx, value, size = fields
        else:
            name, value, size, info, other, shndx = fields
        return name, info, other, shndx, value, size

    def function_symbols(self, section: Section) -> list[ElfSymbol]:
        """Defined STT_FUNC/STT_GNU_IFUNC entries with a non-zero value — the hot path.

        One comprehension over `struct.iter_unpack` picks and names the entries (twice as fast
        as unpacking entry by entry); an ASCII string table, as real ones are, is decoded once
        and sliced as a str.
        """
        data, strings = self._symbol_bytes(section)
        limit = len(strings)

        def unnamed(name: int, index: int) -> str:
            self._require(
                name < limit, f"symbol {index} of {section.name!r} has a name beyond its strings"
            )
            return ""

        fields: Iterator[tuple[int, ...]] = struct.iter_unpack(self._sym, data)
        if not self.is_64bit:  # Elf32_Sym: name, value, size, info, other, shndx
            fields = ((n, i, o, x, v, s) for n, v, s, i, o, x in fields)
        kinds = _FUNCTION_TYPES
        new = tuple.__new__
        if strings.isascii():
            text = strings.decode("ascii") + "\0"
            find = text.find
            return [
                new(
                    ElfSymbol,
                    (text[n : find("\0", n)] or unnamed(n, k), v, s, i >> 4, i & 15, o, x, k),
                )
                for k, (n, i, o, x, v, s) in enumerate(fields)
                if kinds[i] and x and v
            ]
        padded = strings + b"\0"
        find_bytes = padded.find
        return [
            new(
                ElfSymbol,
                (
                    padded[n : find_bytes(b"\0", n)].decode("utf-8", "surrogateescape")
                    or unnamed(n, k),
                    v,
                    s,
                    i >> 4,
                    i & 15,
                    o,
                    x,
                    k,
                ),
            )
            for k, (n, i, o, x, v, s) in enumerate(fields)
            if kinds[i] and x and v
        ]

    def symbol_versions(self) -> list[SymbolVersion] | None:
        """Per `.dynsym` index, the defined version from `.gnu.version` + `.gnu.version_d`.

        None when the file has no `.gnu.version`. Index 0/1 (local/global) and the base
        definition (VER_FLG_BASE, the file's own soname) count as unversioned.
        """
        versym = next((s for s in self.sections if s.type == SHT_GNU_VERSYM), None)
        if versym is None:
            return None
        names = self._version_definitions()
        raw = self.section_data(versym)
        count = len(raw) // 2
        values = struct.unpack(f"{self.endian}{count}H", raw[: count * 2])
        unversioned = SymbolVersion(None, False)
        meaning = {}
        for value in set(values):
            name = names.get(value & 0x7FFF)
            meaning[value] = (
                unversioned if name is None else SymbolVersion(name, bool(value & VERSYM_HIDDEN))
            )
        return [meaning[value] for value in values]

    def _version_definitions(self) -> dict[int, str]:
        verdef = next((s for s in self.sections if s.type == SHT_GNU_VERDEF), None)
        if verdef is None:
            return {}
        data = self.section_data(verdef)
        self._require(
            0 < verdef.link < len(self.sections), "version definitions have no string table"
        )
        strings = self.section_data(self.sections[verdef.link])
        fmt_def, fmt_aux = f"{self.endian}HHHHIII", f"{self.endian}II"
        names: dict[int, str] = {}
        offset = 0
        for _ in range(verdef.info or 0xFFFF):
            self._require(offset + 20 <= len(data), "truncated version definition")
            _version, flags, ndx, count, _hash, aux, next_ = struct.unpack_from(
                fmt_def, data, offset
            )
            if count and not flags & VER_FLG_BASE:
                self._require(offset + aux + 8 <= len(data), "truncated version definition name")
                name, _ = struct.unpack_from(fmt_aux, data, offset + aux)
                names[ndx] = self._string(strings, name)
            if next_ == 0:
                break
            offset += next_
        return names

    # ---- notes, dynamic, debug links ---------------------------------------------------------

    def notes(self, section: Section | None = None) -> Iterator[Note]:
        """Notes of one SHT_NOTE section, or of all note sections (PT_NOTE when none exist)."""
        if section is not None:
            yield from self._parse_notes(section.offset, section.size, section.addralign)
            return
        note_sections = [s for s in self.sections if s.type == SHT_NOTE]
        if note_sections:
            for note_section in note_sections:
                yield from self._parse_notes(
                    note_section.offset, note_section.size, note_section.addralign
                )
        else:
            for segment in self.segments:
                if segment.type == PT_NOTE:
                    yield from self._parse_notes(segment.offset, segment.filesz, segment.align)

    def _parse_notes(self, offset: int, size: int, align: int) -> Iterator[Note]:
        align = 8 if align == 8 else 4
        self._require(offset + size <= self.size, "note section is beyond the end of the file")
        end = offset + size
        header = f"{self.endian}III"
        while offset + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from(header, self._data, offset)
            name_start = offset + 12
            desc_start = offset + _align(12 + namesz, align)  # binutils ELF_NOTE_DESC_OFFSET
            desc_end = desc_start + descsz
            self._require(desc_end <= end, f"note at {offset:#x} runs past its section")
            name = (
                bytes(self._data[name_start : name_start + namesz])
                .rstrip(b"\0")
                .decode("utf-8", "replace")
            )
            yield Note(name, ntype, bytes(self._data[desc_start:desc_end]), desc_start)
            offset += _align(desc_start - offset + descsz, align)

    @property
    def build_id(self) -> str | None:
        """The GNU build-id as lower-case hex, or None."""
        for note in self.notes(self.section(".note.gnu.build-id")):
            if note.name == "GNU" and note.type == NT_GNU_BUILD_ID and note.desc:
                return note.desc.hex()
        return None

    @property
    def debuglink(self) -> tuple[str, int] | None:
        """`.gnu_debuglink`: (debug file name, CRC32 of that file), or None."""
        section = self.section(".gnu_debuglink")
        if section is None:
            return None
        data = self.section_data(section)
        end = data.find(b"\0")
        self._require(end > 0, "empty .gnu_debuglink")
        crc_at = _align(end + 1, 4)
        self._require(crc_at + 4 <= len(data), ".gnu_debuglink has no CRC")
        (crc,) = struct.unpack_from(f"{self.endian}I", data, crc_at)
        return data[:end].decode("utf-8", "surrogateescape"), crc

    @property
    def has_code(self) -> bool:
        """True when some section holds file bytes of executable code (False in debug files)."""
        text = self.section(".text")
        return text is not None and text.type != SHT_NOBITS

    def dynamic(self) -> list[tuple[int, int]]:
        """(tag, value) entries of `.dynamic` up to DT_NULL."""
        section = self.section(".dynamic")
        if section is not None and section.type != SHT_NOBITS:
            data = self.section_data(section)
        else:
            segment = next((s for s in self.segments if s.type == PT_DYNAMIC), None)
            if segment is None:
                return []
            data = self.read(segment.offset, segment.filesz)
        entries = []
        entry_size = struct.calcsize(self._dyn)
        for tag, value in struct.iter_unpack(self._dyn, data[: len(data) - len(data) % entry_size]):
            if tag == DT_NULL:
                break
            entries.append((tag, value))
        return entries

    @property
    def soname(self) -> str | None:
        """DT_SONAME, read through `.dynstr`."""
        entries = self.dynamic()
        value = next((v for t, v in entries if t == DT_SONAME), None)
        dynstr = self.section(".dynstr")
        if value is None or dynstr is None:
            return None
        return self._string(self.section_data(dynstr), value)

    def elffile(self) -> ELFFile:
        """A pyelftools view of the same bytes, for structures this reader does not decode."""
        import io

        from elftools.elf.elffile import ELFFile

        return ELFFile(io.BytesIO(bytes(self._data)))

    def close(self) -> None:
        if isinstance(self._data, mmap.mmap):
            self._data.close()

    def __enter__(self) -> ElfImage:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ElfImage {self.name} {self.type_name} {self.machine_name}>"


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


def is_elf(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a readable regular file starting with the ELF magic."""
    try:
        with open(path, "rb") as stream:
            return stream.read(4) == ELF_MAGIC
    except OSError:
        return False
