"""Reading a binary's functions: symbol tables (or a debug file's), versions, aliases, offsets.

This is the cold half of a SymbolTable: a table loaded from the cache never imports it. A cold
resolution of libc turns about 10,000 entries of `.dynsym` and its debug file's `.symtab` into
3,700 functions, on the start-up path of the first probe on a binary, so the collection is
written as flat passes over plain tuples: entries are grouped by address in one dict, an address
with one name (most) becomes its FunctionSymbol directly, and only shared addresses are ranked.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import NamedTuple

from probescope.errors import SymbolError
from probescope.symbols.debuginfo import find_debug_symbols
from probescope.symbols.elfimage import (
    BINDING_NAMES,
    ET_DYN,
    ET_EXEC,
    SHT_NOBITS,
    STT_GNU_IFUNC,
    ElfImage,
    ElfSymbol,
    SymbolVersion,
)
from probescope.symbols.function import FunctionSymbol, split_versioned_name, versioned_name
from probescope.symbols.golang import go_version
from probescope.symbols.names import NamedSpelling
from probescope.symbols.segment import PF_X, PT_LOAD, Segment

# Lower ranks win the primary name of an address: the dynamic table's public, default-version,
# global name with the fewest leading underscores.
_SOURCE_RANK = {"dynsym": 0, "symtab": 1, "build-id": 1, "debuglink": 1, "minidebuginfo": 1}
_BINDING_RANK = {"global": 0, "unique": 0, "weak": 1, "local": 2}
_BINDING_OF = tuple(BINDING_NAMES.get(bind, "global") for bind in range(16))

# (name, version, hidden, st_info bind, st_info type, st_size, source) of one entry
_Entry = tuple[str, str | None, bool, int, int, int, str]
_NONE = SymbolVersion(None, False)
# The Go linker writes one of these into every binary it links.
GO_SECTIONS = (".go.buildinfo", ".note.go.buildid")


class Functions(NamedTuple):
    """What `read_functions` found in one binary, with the debug-file paths it looked at."""

    elf_type: int
    machine: int
    elf_class: int
    build_id: str | None
    loads: tuple[Segment, ...]
    functions: list[FunctionSymbol]
    spellings: list[tuple[NamedSpelling, ...]]
    sources: tuple[str, ...]
    debug_file: str | None
    has_symtab: bool
    debug_notes: tuple[str, ...]
    checked: tuple[str, ...]
    is_go: bool
    go_version: str | None = None


def read_functions(
    path: str, debug_dirs: Sequence[str], image: ElfImage | None = None
) -> Functions:
    """The functions of the executable or shared library at `path` (or of the open `image`).

    `.dynsym` comes with its versions; `.symtab` from the file itself or, when it is stripped,
    from a debug file found under `debug_dirs` (see debuginfo.py). Raises SymbolError for a
    file uprobes cannot attach to (object files, separate debug files, no executable code).
    """
    own_image = image is None
    image = image or ElfImage.from_path(path)
    try:
        if image.type not in (ET_EXEC, ET_DYN):
            raise SymbolError(
                f"{path!r} is an {image.type_name} file, not an executable or shared library",
                hint="uprobes attach to executables and shared libraries (ET_EXEC, ET_DYN)",
            )
        text = image.section(".text")
        if text is not None and text.type == SHT_NOBITS:
            raise SymbolError(
                f"{path!r} is a separate debug file: its code sections hold no bytes",
                hint="probe the binary it belongs to; probescope finds this file itself",
            )
        if not any(s.flags & PF_X for s in image.loads):
            raise SymbolError(
                f"{path!r} has no executable PT_LOAD segment",
                hint="uprobes need code that the program maps executable",
            )
        sources: list[str] = []
        dynamic: list[ElfSymbol] = []
        versions = None
        dynsym = image.dynsym
        if dynsym is not None:
            versions = image.symbol_versions()
            dynamic = image.function_symbols(dynsym)
            if dynamic:
                sources.append("dynsym")
        static: list[ElfSymbol] = []
        static_source = "symtab"
        checked: tuple[str, ...] = ()
        debug_file = None
        notes: tuple[str, ...] = ()
        symtab = image.symtab
        if symtab is not None:
            static = image.function_symbols(symtab)
            sources.append("symtab")
        else:
            search = find_debug_symbols(image, path, debug_dirs)
            checked = search.checked
            notes = search.rejected
            if search.found is not None:
                debug = search.found.image
                try:
                    debug_symtab = debug.symtab  # never None: the search requires one
                    if debug_symtab is not None:
                        static = debug.function_symbols(debug_symtab)
                        static_source = search.found.kind
                finally:
                    debug.close()
                sources.append(search.found.kind)
                debug_file = search.found.path
        functions, spellings = collect_functions(
            dynamic, versions, static, static_source, image.loads
        )
        is_go = any(image.section(name) is not None for name in GO_SECTIONS)
        return Functions(
            image.type,
            image.machine,
            image.elf_class,
            image.build_id,
            image.loads,
            functions,
            spellings,
            tuple(sources),
            debug_file,
            symtab is not None,
            notes,
            checked,
            is_go,
            go_version(image) if is_go else None,
        )
    finally:
        if own_image:
            image.close()


def collect_functions(
    dynsym: Sequence[ElfSymbol],
    versions: Sequence[SymbolVersion] | None,
    symtab: Sequence[ElfSymbol],
    symtab_source: str,
    loads: Sequence[Segment],
) -> tuple[list[FunctionSymbol], list[tuple[NamedSpelling, ...]]]:
    """Functions sorted by file offset, each with its (name, version, hidden, binding) spellings.

    `dynsym` entries take their versions from `versions` (per `.dynsym` index); `symtab` entries
    (the file's own or a debug file's, named by `symtab_source`) spell versions literally
    (`memcpy@GLIBC_2.2.5`) and mostly repeat `.dynsym` names, which are dropped. Symbols
    outside every executable PT_LOAD are left out.
    """
    groups: dict[int, list[_Entry]] = {}
    known: set[tuple[str, int]] = set()
    remember = known.add
    count = len(versions) if versions is not None else 0
    for name, value, size, bind, kind, _other, _shndx, number in dynsym:
        version, hidden = versions[number] if versions is not None and number < count else _NONE
        entry = (name, version, hidden, bind, kind, size, "dynsym")
        group = groups.get(value)
        if group is None:
            groups[value] = [entry]
        else:
            group.append(entry)
        remember((name, value))
        if version is not None:
            remember((versioned_name(name, version, not hidden), value))
    for name, value, size, bind, kind, _other, _shndx, _number in symtab:
        if (name, value) in known:
            continue
        if "@" in name:
            plain, version, default = split_versioned_name(name)
            entry = (plain, version, not default, bind, kind, size, symtab_source)
        else:
            entry = (name, None, False, bind, kind, size, symtab_source)
        group = groups.get(value)
        if group is None:
            groups[value] = [entry]
        else:
            group.append(entry)
    return _by_offset(groups, loads)


def _by_offset(
    groups: dict[int, list[_Entry]], loads: Sequence[Segment]
) -> tuple[list[FunctionSymbol], list[tuple[NamedSpelling, ...]]]:
    executable = [
        (s.vaddr, s.vaddr + s.filesz, s.offset - s.vaddr)
        for s in loads
        if s.type == PT_LOAD and s.flags & PF_X
    ]
    rows: list[tuple[int, FunctionSymbol, tuple[NamedSpelling, ...]]] = []
    append = rows.append
    new = tuple.__new__
    binding_of = _BINDING_OF
    for vaddr, group in groups.items():
        for low, high, delta in executable:
            if low <= vaddr < high:
                offset = vaddr + delta
                break
        else:
            continue
        if len(group) == 1:
            name, version, hidden, bind, kind, size, source = group[0]
            binding = binding_of[bind]
            function = new(
                FunctionSymbol,
                (
                    name,
                    version,
                    version is not None and not hidden,
                    (),
                    vaddr,
                    size,
                    offset,
                    binding,
                    kind == STT_GNU_IFUNC,
                    source,
                ),
            )
            append((offset, function, ((name, version, hidden, binding),)))
        else:
            append((offset, *_merge(group, vaddr, offset)))
    rows.sort(key=itemgetter(0))  # one row per address, so offsets are unique
    return [row[1] for row in rows], [row[2] for row in rows]


def _merge(
    group: list[_Entry], vaddr: int, offset: int
) -> tuple[FunctionSymbol, tuple[NamedSpelling, ...]]:
    """One FunctionSymbol for several names at one address; the best-ranked name is primary."""
    size = 0
    is_ifunc = False
    seen: set[tuple[str, str | None, bool]] = set()
    ranked = []
    versioned = False
    for position, (name, version, hidden, bind, kind, entry_size, source) in enumerate(group):
        if entry_size > size:
            size = entry_size
        if kind == STT_GNU_IFUNC:
            is_ifunc = True
        key = (name, version, hidden)
        if key in seen:  # the first (.dynsym) entry of a name keeps its binding and source
            continue
        seen.add(key)
        binding = _BINDING_OF[bind]
        ranked.append(
            (
                _SOURCE_RANK.get(source, 1),
                hidden,
                _BINDING_RANK[binding],
                len(name) - len(name.lstrip("_")),
                len(name),
                name,
                version or "",
                position,  # never tied: the fields after it need not compare
                (name, version, hidden, binding),
                source,
            )
        )
        if version is not None:
            versioned = True
    if versioned:  # `memcpy` in .symtab beside `memcpy@@GLIBC_2.14` is one name, not an alias
        names = {row[5] for row in ranked if row[8][1] is not None}
        ranked = [row for row in ranked if row[8][1] is not None or row[5] not in names]
    ranked.sort()
    spellings = tuple(row[8] for row in ranked)
    name, version, hidden, binding = spellings[0]
    aliases = tuple(versioned_name(n, v, not h) for n, v, h, _ in spellings[1:])
    function = tuple.__new__(
        FunctionSymbol,
        (
            name,
            version,
            version is not None and not hidden,
            aliases,
            vaddr,
            size,
            offset,
            binding,
            is_ifunc,
            ranked[0][9],
        ),
    )
    return function, spellings
