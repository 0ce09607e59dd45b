"""USDT (SystemTap SDT) probes of an ELF file: where each site is, its semaphore, its arguments.

Programs built with `<sys/sdt.h>` put a `nop` at each probe site and describe it in a note of
the unallocated section `.note.stapsdt` (read through the section headers, so it survives
`strip`): name "stapsdt", type 3, descriptor = probe address, link-time address of
`_.stapsdt.base`, semaphore address (0 if none) — 8 bytes each in ELFCLASS64, 4 in ELFCLASS32 —
then `provider\\0name\\0arguments\\0`. When prelink moved the file, `.stapsdt.base`'s address
differs from the note's and the difference is added to the probe and semaphore addresses. Each
address becomes a file offset through the PT_LOAD holding it: the kernel wants
`PATH:PC_OFFSET(SEMAPHORE_OFFSET)`, and increments the semaphore (a `short` in a writable
segment) while the probe is enabled. One provider:name has one note per call site.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from probescope.errors import SymbolError
from probescope.symbols.elfimage import ET_DYN, SHT_NOTE, ElfImage
from probescope.symbols.identity import FileIdentity, file_identity
from probescope.symbols.segment import PF_W, Segment
from probescope.symbols.usdt_arguments import SiteContext, UsdtArg, parse_arguments

NOTE_SECTION = ".note.stapsdt"
BASE_SECTION = ".stapsdt.base"
NOTE_NAME = "stapsdt"
NOTE_TYPE = 3

_DAMAGED = "the file is damaged, or its .note.stapsdt was not written by <sys/sdt.h>"

__all__ = [
    "UsdtArg",
    "UsdtProbe",
    "UsdtSite",
    "clear_usdt_cache",
    "find_usdt",
    "read_usdt_probes",
    "usdt_probes",
]


@dataclass(frozen=True)
class UsdtSite:
    """One call site of a probe: a `nop` at file offset `pc_offset`.

    `pc` and `semaphore` are link-time addresses (after the prelink adjustment; `semaphore` 0
    when there is none); `semaphore_offset` is the kernel's `(REF)` or None; `arguments` is the
    note's argument string as written.
    """

    pc: int
    pc_offset: int
    semaphore: int
    semaphore_offset: int | None
    arguments: str
    args: tuple[UsdtArg, ...]

    @property
    def problems(self) -> tuple[str, ...]:
        """Why some arguments have no fetcharg (empty when all can be fetched)."""
        return tuple(arg.problem for arg in self.args if arg.problem is not None)

    def location(self, path: str) -> str:
        """`PATH:0xPC(0xSEM)`, the probe point of a uprobe definition."""
        text = f"{path}:{self.pc_offset:#x}"
        return text if self.semaphore_offset is None else f"{text}({self.semaphore_offset:#x})"

    def fetchargs(self) -> tuple[str, ...]:
        """`argN=FETCHARG` for every argument; SymbolError naming each one that has none."""
        problems = self.problems
        if problems:
            raise SymbolError(
                "; ".join(problems),
                hint="leave those arguments out, or use another probe site",
            )
        return tuple(arg.definition for arg in self.args if arg.definition is not None)


@dataclass(frozen=True)
class UsdtProbe:
    """`provider:name` and its sites, sorted by address."""

    provider: str
    name: str
    sites: tuple[UsdtSite, ...]

    @property
    def full_name(self) -> str:
        return f"{self.provider}:{self.name}"

    @property
    def semaphore_offset(self) -> int | None:
        """The file offset of the probe's semaphore (shared by its sites), or None."""
        return next(
            (s.semaphore_offset for s in self.sites if s.semaphore_offset is not None), None
        )


# ---- reading notes ---------------------------------------------------------------------------


def read_usdt_probes(
    image: ElfImage,
    *,
    layout: ElfImage | None = None,
    symbol_address: Callable[[str], int | None] | None = None,
) -> list[UsdtProbe]:
    """The USDT probes described in `image`, sorted by provider and name.

    `layout` is the file whose PT_LOADs turn addresses into file offsets — the binary itself
    (default), or the binary a separate debug file `image` belongs to. `symbol_address` resolves
    the symbols some operands name (default: `image`'s and `layout`'s symbol tables).
    """
    layout = layout or image
    section = image.section(NOTE_SECTION)
    if section is None or section.type != SHT_NOTE:
        return []
    if not layout.loads:
        raise SymbolError(
            f"{layout.name}: has no program headers, so USDT sites have no file offsets",
            hint="give the executable or shared library, not an object file",
        )
    if all(s.filesz == 0 for s in layout.loads if s.executable):
        raise SymbolError(
            f"{layout.name} is a separate debug file: its segments hold no code",
            hint="give the binary it belongs to (uprobes attach to that file)",
        )
    base = image.section(BASE_SECTION)
    resolve = symbol_address or _symbol_resolver(image, layout)
    address_size = 8 if image.is_64bit else 4
    mask = (1 << (8 * address_size)) - 1
    unpack = struct.Struct(f"{image.endian}3{'Q' if address_size == 8 else 'I'}").unpack_from
    groups: dict[tuple[str, str], list[UsdtSite]] = {}
    for number, note in enumerate(image.notes(section)):
        if note.name != NOTE_NAME or note.type != NOTE_TYPE:
            continue
        where = f"{image.name}: USDT note {number} at file offset {note.offset:#x}"
        if len(note.desc) < 3 * address_size + 2:
            raise SymbolError(f"{where} is truncated ({len(note.desc)} bytes)", hint=_DAMAGED)
        pc, note_base, semaphore = unpack(note.desc)
        strings = note.desc[3 * address_size :].split(b"\0")
        if len(strings) < 3:
            raise SymbolError(f"{where} lacks its provider and name strings", hint=_DAMAGED)
        provider, name = (s.decode("utf-8", "replace") for s in strings[:2])
        arguments = strings[2].decode("utf-8", "replace")
        if base is not None and note_base:
            pc = (pc + base.addr - note_base) & mask
            if semaphore:
                semaphore = (semaphore + base.addr - note_base) & mask
        where = f"{image.name}: USDT probe {provider}:{name}"
        context = SiteContext(
            machine=image.machine,
            is_64bit=image.is_64bit,
            pc=pc,
            position_independent=layout.type == ET_DYN,
            symbol_address=resolve,
        )
        site = UsdtSite(
            pc=pc,
            pc_offset=_pc_offset(layout, pc, where),
            semaphore=semaphore,
            semaphore_offset=_semaphore_offset(layout, semaphore, where) if semaphore else None,
            arguments=arguments,
            args=parse_arguments(arguments, context),
        )
        groups.setdefault((provider, name), []).append(site)
    return [
        UsdtProbe(provider, name, tuple(sorted(sites, key=lambda s: s.pc)))
        for (provider, name), sites in sorted(groups.items())
    ]


def _pc_offset(layout: ElfImage, pc: int, where: str) -> int:
    segment = layout.load_for_vaddr(pc)
    if segment is None or not segment.executable:
        raise SymbolError(
            f"{where}: its address {pc:#x} is not in an executable segment of {layout.name}",
            hint=_segments_hint(layout.loads),
        )
    return pc - segment.vaddr + segment.offset


def _semaphore_offset(layout: ElfImage, semaphore: int, where: str) -> int:
    segment = layout.load_for_vaddr(semaphore)
    if segment is None or segment.executable or not segment.flags & PF_W:
        raise SymbolError(
            f"{where}: its semaphore {semaphore:#x} is not in a writable data segment "
            f"of {layout.name}",
            hint=_segments_hint(layout.loads),
        )
    return semaphore - segment.vaddr + segment.offset


def _segments_hint(loads: tuple[Segment, ...]) -> str:
    ranges = ", ".join(
        f"{s.vaddr:#x}-{s.vaddr + s.filesz:#x} "
        + "".join(f for f, bit in (("r", 4), ("w", 2), ("x", 1)) if s.flags & bit)
        for s in loads
    )
    return f"the file's PT_LOAD segments: {ranges}; the note or the file is damaged"


def _symbol_resolver(*images: ElfImage) -> Callable[[str], int | None]:
    """Looks a name up in `.symtab`, then `.dynsym`, then a debug file (built on first use)."""
    table: dict[str, int] | None = None

    def resolve(name: str) -> int | None:
        nonlocal table
        if table is None:
            table = _symbol_values(images)
        return table.get(name)

    return resolve


def _symbol_values(images: tuple[ElfImage, ...]) -> dict[str, int]:
    values: dict[str, int] = {}
    sources = list(dict.fromkeys(images))
    for image in sources:
        for section in (image.symtab, image.dynsym):
            if section is None:
                continue
            for symbol in image.symbols(section):
                if symbol.shndx and symbol.value and symbol.name:
                    values.setdefault(symbol.name.split("@", 1)[0], symbol.value)
    if all(image.symtab is None for image in sources):
        from probescope.symbols.debuginfo import find_debug_symbols

        found = find_debug_symbols(sources[-1], sources[-1].name).found
        if found is not None and found.image.symtab is not None:
            for symbol in found.image.symbols(found.image.symtab):
                if symbol.shndx and symbol.value and symbol.name:
                    values.setdefault(symbol.name, symbol.value)
    return values


# ---- by path, cached -------------------------------------------------------------------------

_CACHE: OrderedDict[tuple[str, FileIdentity], tuple[UsdtProbe, ...]] = OrderedDict()
_CACHE_SIZE = 64


def clear_usdt_cache() -> None:
    _CACHE.clear()


def usdt_probes(path: str | os.PathLike[str]) -> list[UsdtProbe]:
    """The USDT probes of the binary at `path`, sorted by provider and name (cached by file).

    When the binary has no `.note.stapsdt` but its separate debug file (build-id or
    `.gnu_debuglink`) does, the notes are read there and placed with the binary's segments.
    """
    path = os.fspath(path)
    identity = file_identity(path)
    key = (path, identity)
    known = _CACHE.get(key)
    if known is not None:
        _CACHE.move_to_end(key)
        return list(known)
    with ElfImage.from_path(path) as image:
        probes = read_usdt_probes(image)
        if not probes and image.section(NOTE_SECTION) is None and image.has_code:
            probes = _probes_from_debug_file(image, path)
    if file_identity(path) == identity:
        _CACHE[key] = tuple(probes)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return probes


def _probes_from_debug_file(image: ElfImage, path: str) -> list[UsdtProbe]:
    from probescope.symbols.debuginfo import find_debug_symbols

    found = find_debug_symbols(image, path).found
    if found is None or found.path is None:
        return []
    try:
        return read_usdt_probes(found.image, layout=image)
    finally:
        found.image.close()


def find_usdt(path: str | os.PathLike[str], provider_glob: str, name_glob: str) -> list[UsdtProbe]:
    """The probes of `path` whose provider and name match the shell globs.

    Raises SymbolError listing the file's probes (closest first) when none matches.
    """
    probes = usdt_probes(path)
    found = [
        p
        for p in probes
        if fnmatch.fnmatchcase(p.provider, provider_glob) and fnmatch.fnmatchcase(p.name, name_glob)
    ]
    if found:
        return found
    wanted = f"{provider_glob}:{name_glob}"
    if not probes:
        raise SymbolError(
            f"{os.fspath(path)} has no USDT probes (no {NOTE_SECTION} notes)",
            hint="USDT probes exist only in programs built with <sys/sdt.h> or dtrace -G",
        )
    names = [p.full_name for p in probes]
    close = difflib.get_close_matches(wanted.replace("-", "__"), names, n=4, cutoff=0.7)
    if not close:
        close = difflib.get_close_matches(name_glob, [p.name for p in probes], n=4, cutoff=0.7)
        close = [p.full_name for p in probes if p.name in close]
    shown = ", ".join(names[:20]) + (f" … ({len(names)} in all)" if len(names) > 20 else "")
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise SymbolError(
        f"no USDT probe {wanted} in {os.fspath(path)}",
        hint=f"{hint}its probes: {shown}",
    )
