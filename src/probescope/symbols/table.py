"""SymbolTable: every function of one binary with its uprobe file offset, and name lookups on it.

Functions come from `.dynsym` (with `.gnu.version` versions) and `.symtab`; a stripped binary
gets its `.symtab` from a debug file (collect.py reads the tables, debuginfo.py finds debug
files). Each symbol's `st_value` is mapped to a file offset through the executable PT_LOAD that
contains it — one rule for ET_EXEC and ET_DYN. Names defined at one address collapse into one
FunctionSymbol with aliases. Tables are cached on disk (cache.py) and in memory, so a second
resolution of libc costs a stat and a dict lookup; a cached table never imports the ELF reader.
C++ and Rust functions also answer to their demangled names (demangled_names.py), built the
first time a lookup needs them and then kept in the cache with the table.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from probescope.errors import SymbolError
from probescope.symbols import cache
from probescope.symbols.debuginfo import debuginfod_cache_dir, default_debug_dirs
from probescope.symbols.function import FunctionSymbol, split_versioned_name, versioned_name
from probescope.symbols.identity import FileIdentity, file_identity
from probescope.symbols.names import NameIndex
from probescope.symbols.segment import Segment

if TYPE_CHECKING:
    from probescope.symbols.debuginfo import Package
    from probescope.symbols.demangled_names import DemangledNames
    from probescope.symbols.elfimage import ElfImage

_MEMO: dict[tuple[int, int, tuple[str, ...]], SymbolTable] = {}


def clear_memory_cache() -> None:
    """Forget the tables held in this process (the disk cache stays)."""
    _MEMO.clear()


class SymbolTable:
    """The functions of one ELF file, sorted by file offset.

    Build one with `SymbolTable.for_path(path)` (cached). `functions` lists every function;
    `lookup(name)` finds one by `name`, `name@VER` or `name@@VER`, or by a demangled C++/Rust
    name (`ns::Class::method(int)`, `ns::Class::method`); `match(glob)` finds many, over plain
    and demangled names; `demangled_name(function)` spells a function as `nm -C` does;
    `function_at_offset(offset)` finds the function containing a file offset. `is_go` says the
    Go linker made the file (return probes must stay out of it).
    """

    def __init__(
        self,
        *,
        path: str,
        identity: FileIdentity,
        elf_type: int,
        machine: int,
        elf_class: int,
        build_id: str | None,
        loads: Sequence[Segment],
        functions: list[FunctionSymbol],
        names: NameIndex,
        sources: tuple[str, ...],
        debug_file: str | None,
        has_symtab: bool,
        debug_notes: tuple[str, ...] = (),
        is_go: bool = False,
        go_version: str | None = None,
        from_cache: bool = False,
    ) -> None:
        self.path = path
        self.identity = identity
        self.elf_type = elf_type
        self.machine = machine
        self.elf_class = elf_class
        self.build_id = build_id
        self.loads = tuple(loads)
        self.functions = functions
        self._index = names
        self.sources = sources
        self.debug_file = debug_file
        self.has_symtab = has_symtab
        self.debug_notes = debug_notes
        self.is_go = is_go  # linked by Go: its runtime moves goroutine stacks
        self.go_version = go_version  # `go1.19.8`: whether Go functions take registers
        self.from_cache = from_cache
        self._starts: list[int] | None = None

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def for_path(
        cls,
        path: str | os.PathLike[str],
        *,
        debug_dirs: Sequence[str] | None = None,
        use_cache: bool = True,
    ) -> SymbolTable:
        """The table of the file at `path`, from memory, the disk cache, or the ELF file itself.

        `debug_dirs` replaces the debug-file directories (default `$PROBESCOPE_DEBUG_DIRS` or
        `/usr/lib/debug`). Raises SymbolError when the file cannot be read or is not an
        executable or shared library.
        """
        path = os.fspath(path)
        identity = file_identity(path)
        dirs = tuple(default_debug_dirs() if debug_dirs is None else debug_dirs)
        searched = (*dirs, debuginfod_cache_dir())  # everything the debug-file search reads
        memo_key = (identity.device, identity.inode, searched)
        if use_cache:
            known = _MEMO.get(memo_key)
            if known is not None and known.identity == identity and known._deps_unchanged():
                return known if known.path == path else known._with_path(path)
            cached = cache.load(identity, searched)
            if cached is not None:
                deps, state = cached
                try:
                    table = cls._from_state(path, identity, state)
                except (TypeError, ValueError, IndexError):
                    table = None
                if table is not None:
                    table._deps, table._searched = deps, searched
                    _MEMO[memo_key] = table
                    return table
        table, deps = cls._build(path, identity, dirs)
        if use_cache and file_identity(path) == identity:  # not replaced while we read it
            cache.store(identity, searched, deps, table._state())
            table._deps, table._searched = deps, searched
            _MEMO[memo_key] = table
        return table

    @classmethod
    def from_image(
        cls, image: ElfImage, *, path: str | None = None, debug_dirs: Sequence[str] | None = None
    ) -> SymbolTable:
        """A table built straight from an open image (no cache)."""
        path = path or image.name
        dirs = tuple(default_debug_dirs() if debug_dirs is None else debug_dirs)
        table, _ = cls._build(path, file_identity(path), dirs, image=image)
        return table

    @classmethod
    def _build(
        cls,
        path: str,
        identity: FileIdentity,
        dirs: tuple[str, ...],
        image: ElfImage | None = None,
    ) -> tuple[SymbolTable, cache.Dependencies]:
        from probescope.symbols.collect import read_functions

        found = read_functions(path, dirs, image)
        table = cls(
            path=path,
            identity=identity,
            elf_type=found.elf_type,
            machine=found.machine,
            elf_class=found.elf_class,
            build_id=found.build_id,
            loads=found.loads,
            functions=found.functions,
            names=NameIndex.build(found.spellings),
            sources=found.sources,
            debug_file=found.debug_file,
            has_symtab=found.has_symtab,
            debug_notes=found.debug_notes,
            is_go=found.is_go,
            go_version=found.go_version,
        )
        return table, cache.dependencies(found.checked)

    # ---- cache state -----------------------------------------------------------------------------

    _deps: cache.Dependencies = ()
    _searched: tuple[str, ...] | None = None  # set when the table lives in the disk cache
    _package: Package | Literal[False] | None = False  # False: not asked yet
    _demangled: DemangledNames | None = None  # None: not built yet

    def _state(self) -> tuple[Any, ...]:
        return (
            self.elf_type,
            self.machine,
            self.elf_class,
            self.build_id,
            tuple(tuple(s) for s in self.loads),
            tuple(tuple(f) for f in self.functions),
            self._index.state(),
            self.sources,
            self.debug_file,
            self.has_symtab,
            self.debug_notes,
            self.is_go,
            self.go_version,
            self._package,
            None if self._demangled is None else self._demangled.state(),
        )

    @classmethod
    def _from_state(cls, path: str, identity: FileIdentity, state: tuple[Any, ...]) -> SymbolTable:
        (
            elf_type,
            machine,
            elf_class,
            build_id,
            loads,
            rows,
            names,
            sources,
            debug_file,
            has_symtab,
            notes,
            is_go,
            go_version,
            package,
            demangled,
        ) = state
        make = partial(tuple.__new__, FunctionSymbol)
        table = cls(
            path=path,
            identity=identity,
            elf_type=elf_type,
            machine=machine,
            elf_class=elf_class,
            build_id=build_id,
            loads=[Segment._make(s) for s in loads],
            functions=list(map(make, rows)),
            names=NameIndex(*names),
            sources=tuple(sources),
            debug_file=debug_file,
            has_symtab=has_symtab,
            debug_notes=tuple(notes),
            is_go=is_go,
            go_version=go_version,
            from_cache=True,
        )
        table._package = package
        if demangled is not None:
            from probescope.symbols.demangled_names import DemangledNames

            table._demangled = DemangledNames(*demangled)
        return table

    def _deps_unchanged(self) -> bool:
        return cache.dependencies([p for p, _ in self._deps]) == self._deps

    def debug_info_hint(self) -> str:
        """How to get this binary's symbols (debuginfo.debug_info_hint). The package that ships
        it is asked of the package manager once and kept with the table in the disk cache."""
        from probescope.symbols import debuginfo

        if self._package is False:
            self._package = debuginfo.owning_package(self.path)
            if self._searched is not None and file_identity(self.path) == self.identity:
                cache.store(self.identity, self._searched, self._deps, self._state())
        return debuginfo.debug_info_hint(self.path, self.build_id, self._package)

    @property
    def demangled(self) -> DemangledNames:
        """The demangled names of the table's C++ and Rust functions (empty for C), built on
        first use and then kept with the table in the disk cache."""
        if self._demangled is None:
            from probescope.symbols.demangled_names import DemangledNames

            self._demangled = DemangledNames.build(
                (number, function.names) for number, function in enumerate(self.functions)
            )
            if self._searched is not None and file_identity(self.path) == self.identity:
                cache.store(self.identity, self._searched, self._deps, self._state())
        return self._demangled

    def takes_go_registers(self, function: FunctionSymbol) -> bool:
        """Whether `function` is a Go function taking Go's register ABI (symbols/golang.py)."""
        from probescope.symbols.golang import uses_register_abi

        return self.is_go and uses_register_abi(self.go_version, self.machine, function.name)

    def demangled_name(self, function: FunctionSymbol) -> str:
        """`function` as `nm -C` spells it (`ns::Class::method(int)`); C names as they are."""
        if not function.name.startswith(("_Z", "_R")):
            return function.display_name
        return self.demangled.spelling(function.display_name)

    def _with_path(self, path: str) -> SymbolTable:
        twin = SymbolTable.__new__(SymbolTable)
        twin.__dict__.update(self.__dict__)
        twin.path = path
        return twin

    # ---- description -----------------------------------------------------------------------------

    @property
    def type_name(self) -> str:
        from probescope.symbols.elfimage import ELF_TYPE_NAMES

        return ELF_TYPE_NAMES.get(self.elf_type, str(self.elf_type))

    @property
    def machine_name(self) -> str:
        from probescope.symbols.elfimage import MACHINE_NAMES

        return MACHINE_NAMES.get(self.machine, f"machine {self.machine}")

    @property
    def stripped(self) -> bool:
        """No `.symtab` in the binary and none found in a debug file: only `.dynsym` names."""
        return (
            not self.has_symtab and self.debug_file is None and "minidebuginfo" not in self.sources
        )

    def describe_sources(self) -> str:
        """e.g. `.dynsym + build-id debug file /usr/lib/debug/.build-id/93/….debug`."""
        parts = []
        for source in self.sources:
            if source in ("dynsym", "symtab"):
                parts.append(f".{source}")
            elif source == "minidebuginfo":
                parts.append(".gnu_debugdata (MiniDebugInfo)")
            else:
                parts.append(f"{source} debug file {self.debug_file}")
        return " + ".join(parts) if parts else "no symbol tables"

    # ---- address arithmetic ----------------------------------------------------------------------

    def vaddr_to_offset(self, vaddr: int, *, executable: bool = True) -> int | None:
        """File offset of link-time `vaddr` through its PT_LOAD (PF_X required by default)."""
        for segment in self.loads:
            if segment.contains_vaddr(vaddr):
                if executable and not segment.executable:
                    return None
                return vaddr - segment.vaddr + segment.offset
        return None

    def offset_to_vaddr(self, offset: int) -> int | None:
        for segment in self.loads:
            if segment.contains_offset(offset):
                return offset - segment.offset + segment.vaddr
        return None

    def load_for_offset(self, offset: int) -> Segment | None:
        for segment in self.loads:
            if segment.contains_offset(offset):
                return segment
        return None

    # ---- queries ---------------------------------------------------------------------------------

    def lookup(self, name: str) -> FunctionSymbol:
        """The function called `name` (`name`, `name@VER` or `name@@VER`).

        A plain name prefers the default version over hidden ones (as the linker binds new
        references) and non-weak over weak definitions; several remaining definitions at
        different offsets raise SymbolError listing them. `name@VER` matches VER whether it is
        the default or not; `name@@VER` only the default.
        """
        plain, version, default = split_versioned_name(name) if "@" in name else (name, None, None)
        number = self._index.single(plain, version, default)
        if number is not None:
            return self.functions[number]
        candidates = self._index.spellings(plain)
        if version is not None:
            candidates = [c for c in candidates if c[1] == version and (not default or not c[2])]
        if not candidates:
            return self._lookup_demangled(name)
        if len(candidates) == 1:
            return self.functions[candidates[0][0]]
        if len({c[0] for c in candidates}) > 1 and version is None:
            visible = [c for c in candidates if not c[2]]
            candidates = visible or candidates
        if len({c[0] for c in candidates}) > 1:
            strong = [c for c in candidates if c[3] != "weak"]
            candidates = strong or candidates
        numbers = sorted({c[0] for c in candidates})
        if len(numbers) == 1:
            return self.functions[numbers[0]]
        listing = ", ".join(
            f"{self.functions[n].display_name} at {self.functions[n].offset:#x} "
            f"({self.functions[n].binding})"
            for n in numbers[:12]
        )
        more = f" and {len(numbers) - 12} more" if len(numbers) > 12 else ""
        raise SymbolError(
            f"{name!r} is ambiguous in {self.path}: {len(numbers)} definitions: {listing}{more}",
            hint="pick one by its file offset (PATH:0xOFFSET) or a versioned name (name@@VERSION)",
        )

    def _lookup_demangled(self, name: str) -> FunctionSymbol:
        """The function a demangled spelling names; several (overloads, template instances,
        C1/C2 constructors at different addresses) raise SymbolError listing them."""
        numbers = self.demangled.numbers(name) if self._may_be_demangled(name) else []
        if not numbers:
            raise self._not_found(name)
        if len(numbers) > 1:
            strong = [n for n in numbers if self.functions[n].binding != "local"]
            numbers = strong or numbers
        if len(numbers) == 1:
            return self.functions[numbers[0]]
        listing = ", ".join(
            f"{self.demangled_name(self.functions[n])} at {self.functions[n].offset:#x}"
            for n in numbers[:12]
        )
        more = f" and {len(numbers) - 12} more" if len(numbers) > 12 else ""
        example = self.demangled_name(self.functions[numbers[0]])
        raise SymbolError(
            f"{name!r} is ambiguous in {self.path}: {len(numbers)} functions: {listing}{more}",
            hint=f"write the parameter list to pick one (e.g. {example!r}), "
            f"or a glob ('{name.strip()}*') for all of them",
        )

    def _may_be_demangled(self, name: str) -> bool:
        """Whether a demangled lookup can find `name`: the table has mangled names and `name`
        is not one itself."""
        return not name.startswith(("_Z", "_R")) and bool(self.demangled)

    def _not_found(self, name: str) -> SymbolError:
        plain = split_versioned_name(name)[0]
        message = f"no function {name!r} in {self.path}"
        hints: list[str] = []
        other_kind = _non_function_kind(self.path, plain)
        if other_kind:
            message += f" ({plain!r} is {other_kind}, not a function)"
        elif plain in self._index:
            spellings = sorted(
                {
                    versioned_name(plain, c[1], not c[2])
                    for c in self._index.spellings(plain)
                    if c[1] is not None
                }
            )
            hints.append("defined versions: " + ", ".join(spellings))
        else:
            import difflib

            close = difflib.get_close_matches(plain, list(self._index), n=5, cutoff=0.75)
            if self._may_be_demangled(plain):
                close = self.demangled.close_to(plain) or close
            if close:
                hints.append("did you mean " + ", ".join(close) + "?")
        if self.stripped and not other_kind:
            message += f" (the file is stripped: only its {len(self.functions)} exported "
            message += "functions are known)"
            hints.append("to see all functions, " + self.debug_info_hint())
            hints += [f"ignored {note}" for note in self.debug_notes]
        hints.append(f"`probescope symbols {self.path}` lists the functions")
        return SymbolError(message, hint="\n      ".join(hints))  # aligned under "hint: "

    def match(self, pattern: str) -> list[FunctionSymbol]:
        """Functions any of whose names matches the shell glob `pattern` (sorted by offset).

        A pattern without `@` matches plain names; with `@` it matches the versioned spelling.
        C++ and Rust functions match by their demangled names too (`'ns::Class::*'`). A
        pattern that is a function's exact name (`f[abi:cxx11]()`) finds that function.
        """
        import fnmatch
        import re

        if not any(ch in pattern for ch in "*?["):
            try:
                return [self.lookup(pattern)]
            except SymbolError:
                return self.functions_named(pattern) or [
                    self.functions[n]
                    for n in sorted(self.demangled.numbers(pattern))
                    if self._may_be_demangled(pattern)
                ]
        if "[" in pattern and "*" not in pattern and "?" not in pattern:
            with contextlib.suppress(SymbolError):
                return [self.lookup(pattern)]
        regex = re.compile(fnmatch.translate(pattern))
        versioned = "@" in pattern
        demangled = self.demangled.match(pattern) if self._may_be_demangled(pattern) else set()
        found = []
        for number, function in enumerate(self.functions):
            names: Iterable[str] = function.names
            if not versioned:
                names = (split_versioned_name(n)[0] for n in names)
            if number in demangled or any(regex.match(n) for n in names):
                found.append(function)
        return found

    def functions_named(self, name: str) -> list[FunctionSymbol]:
        """Every function spelled `name` (`name`, `name@VER`, `name@@VER`), sorted by offset;
        empty when there is none — unlike `lookup`, never an error and never a suggestion."""
        plain, version, default = split_versioned_name(name)
        numbers = {
            c[0]
            for c in self._index.spellings(plain)
            if version is None or (c[1] == version and (not default or not c[2]))
        }
        return [self.functions[n] for n in sorted(numbers)]

    def _function_starts(self) -> list[int]:
        if self._starts is None:
            self._starts = [f.offset for f in self.functions]
        return self._starts

    def next_function_offset(self, offset: int) -> int | None:
        """The start of the first function after file `offset`, if any."""
        starts = self._function_starts()
        position = bisect.bisect_right(starts, offset)
        return starts[position] if position < len(starts) else None

    def function_at_offset(self, offset: int) -> FunctionSymbol | None:
        """The function whose bytes hold file `offset` (its start, or inside its st_size)."""
        position = bisect.bisect_right(self._function_starts(), offset) - 1
        for number in range(position, max(position - 16, -1), -1):
            function = self.functions[number]
            if function.offset == offset or function.offset <= offset < function.end_offset:
                return function
        return None

    def __len__(self) -> int:
        return len(self.functions)

    def __repr__(self) -> str:
        return f"<SymbolTable {self.path} {self.type_name} {len(self.functions)} functions>"


def _non_function_kind(path: str, name: str) -> str | None:
    """If `name` is a data object or another non-function symbol of `path`, say which."""
    from probescope.symbols.elfimage import STT_FUNC, STT_GNU_IFUNC, ElfImage

    try:
        with ElfImage.from_path(path) as image:
            for section in (image.dynsym, image.symtab):
                if section is None:
                    continue
                for symbol in image.symbols(section):
                    if split_versioned_name(symbol.name)[0] != name or symbol.shndx == 0:
                        continue
                    if symbol.type in (STT_FUNC, STT_GNU_IFUNC):
                        return None
                    return {1: "a data object", 6: "a TLS variable"}.get(
                        symbol.type, f"a symbol of type {symbol.type}"
                    )
    except SymbolError:
        return None
    return None
