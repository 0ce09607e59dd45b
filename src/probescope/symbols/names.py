"""NameIndex: every spelling of a binary's functions → function number, packed for a fast cache.

libc has about 6,500 names. Kept as lists of (number, version, hidden, binding) tuples, they
took as long to unmarshal from the cache as the functions themselves; here each spelling is one
int (function number, version as an index into one shared tuple, hidden flag, binding) and a
name with a single spelling, nearly every name, maps straight to its int.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from probescope.errors import SymbolError

# (function number, version, hidden, binding) of one spelling
Spelling = tuple[int, str | None, bool, str]
# (name, version, hidden, binding) of one name of one function, as collected from the tables
NamedSpelling = tuple[str, str | None, bool, str]

BINDINGS = ("global", "weak", "local", "unique")
_BINDING_CODES = {binding: code for code, binding in enumerate(BINDINGS)}
_NUMBER_SHIFT = 24
_VERSION_MASK = (1 << (_NUMBER_SHIFT - 3)) - 1


class NameIndex:
    """Lookups by plain name: `spellings(name)`, `single(name)`, `in`, iteration over names."""

    __slots__ = ("_codes", "_versions")

    def __init__(self, codes: dict[str, int | tuple[int, ...]], versions: tuple[str, ...]) -> None:
        self._codes = codes
        self._versions = versions

    @classmethod
    def build(cls, spellings: Sequence[Sequence[NamedSpelling]]) -> NameIndex:
        """The index of functions numbered in order, each with its (name, version, …) spellings."""
        version_ids: dict[str, int] = {}
        codes: dict[str, int | tuple[int, ...]] = {}
        binding_codes = _BINDING_CODES
        for number, names in enumerate(spellings):
            base = number << _NUMBER_SHIFT
            for name, version, hidden, binding in names:
                if version is None:
                    version_id = 0
                else:
                    version_id = version_ids.get(version, 0)
                    if not version_id:
                        version_id = version_ids[version] = len(version_ids) + 1
                        if version_id > _VERSION_MASK:
                            raise SymbolError(f"more than {_VERSION_MASK} symbol versions")
                code = base | version_id << 3 | hidden << 2 | binding_codes[binding]
                known = codes.get(name)
                if known is None:
                    codes[name] = code
                elif isinstance(known, int):
                    codes[name] = (known, code)
                else:
                    codes[name] = (*known, code)
        return cls(codes, tuple(version_ids))

    def state(self) -> tuple[dict[str, int | tuple[int, ...]], tuple[str, ...]]:
        """Plain data for the cache (marshal-able); `NameIndex(*state)` restores it."""
        return self._codes, self._versions

    def single(
        self, name: str, version: str | None = None, default: bool | None = None
    ) -> int | None:
        """The function number of `name` when it has exactly one spelling, else None.

        With `version`, that spelling must also have this version, and with `default` be the
        default (not hidden) one: the fast path of `name@VER` and `name@@VER` lookups.
        """
        code = self._codes.get(name)
        if not isinstance(code, int):
            return None
        if version is not None:
            version_id = code >> 3 & _VERSION_MASK
            if not version_id or self._versions[version_id - 1] != version:
                return None
            if default and code & 4:
                return None
        return code >> _NUMBER_SHIFT

    def spellings(self, name: str) -> list[Spelling]:
        """Every (function number, version, hidden, binding) spelled `name`, in table order."""
        entry = self._codes.get(name)
        if entry is None:
            return []
        versions = self._versions
        return [
            (
                code >> _NUMBER_SHIFT,
                versions[version_id - 1] if (version_id := code >> 3 & _VERSION_MASK) else None,
                bool(code & 4),
                BINDINGS[code & 3],
            )
            for code in ((entry,) if isinstance(entry, int) else entry)
        ]

    def __contains__(self, name: object) -> bool:
        return name in self._codes

    def __iter__(self) -> Iterator[str]:
        return iter(self._codes)

    def __len__(self) -> int:
        return len(self._codes)
