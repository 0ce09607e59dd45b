"""DemangledNames: a table's C++ and Rust functions under the names people write for them.

Built once per table from its mangled names (kept in the symbol cache beside the table): each
mangled name's demangled spelling for display, and the keys a lookup accepts for it — the
whole demangled name (`ns::Class::method(int)`), its qualified name (`ns::Class::method`) and,
for a template or generic instance, that name without its arguments (`ns::add` for
`int ns::add<int>(int, int)`) — all compared `squeeze`d, so spacing does not matter. A clone
GCC split off (`[clone .cold]`) answers only to its whole name, so that `ns::f` does not turn
ambiguous between a function and its cold part.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from probescope.symbols.demangle import (
    demangle,
    function_path,
    is_mangled,
    squeeze,
    without_template_arguments,
)

# (function number, spellings) of the functions of a table
Spellings = Iterable[tuple[int, Sequence[str]]]


class DemangledNames:
    """`spelling(name)` for display; `numbers(text)` and `match(glob)` for lookups."""

    __slots__ = ("_keys", "_spelled", "_whole")

    def __init__(
        self,
        spelled: dict[str, str],
        keys: dict[str, int | tuple[int, ...]],
        whole: dict[int, tuple[str, ...]],
    ) -> None:
        self._spelled = spelled  # mangled name (with version) -> demangled spelling
        self._keys = keys  # squeezed key -> function numbers
        self._whole = whole  # function number -> its demangled names (for globs)

    @classmethod
    def build(cls, functions: Spellings) -> DemangledNames:
        spelled: dict[str, str] = {}
        keys: dict[str, set[int]] = {}
        whole: dict[int, list[str]] = {}
        for number, names in functions:
            for name in names:
                if not is_mangled(name):
                    continue
                plain, at, version = name.partition("@")
                text = demangle(plain)
                if text is None:
                    continue
                spelled[name] = f"{text}{at}{version}"
                whole.setdefault(number, []).append(text)
                for key in _keys_of(text):
                    keys.setdefault(key, set()).add(number)
        packed: dict[str, int | tuple[int, ...]] = {
            key: next(iter(numbers)) if len(numbers) == 1 else tuple(sorted(numbers))
            for key, numbers in keys.items()
        }
        return cls(spelled, packed, {n: tuple(texts) for n, texts in whole.items()})

    def state(
        self,
    ) -> tuple[dict[str, str], dict[str, int | tuple[int, ...]], dict[int, tuple[str, ...]]]:
        """Plain data for the cache (marshal-able); `DemangledNames(*state)` restores it."""
        return self._spelled, self._keys, self._whole

    def __bool__(self) -> bool:
        return bool(self._spelled)

    def spelling(self, name: str) -> str:
        """The demangled spelling of one of the table's names, or the name itself."""
        return self._spelled.get(name, name)

    def numbers(self, text: str) -> list[int]:
        """Function numbers a demangled name, qualified name or template name denotes."""
        found = self._keys.get(squeeze(text.strip()))
        if found is None:
            return []
        return [found] if isinstance(found, int) else list(found)

    def match(self, pattern: str) -> set[int]:
        """Function numbers any of whose demangled names matches the shell glob `pattern`, as
        written or squeezed (`'ns::Class::*'`, `'*method(int, *'`)."""
        patterns = {pattern, squeeze(pattern)}
        regexes = [re.compile(fnmatch.translate(p)) for p in patterns]
        found = set()
        for number, texts in self._whole.items():
            for text in texts:
                candidates = (text, squeeze(text), function_path(text))
                if any(r.match(c) for r in regexes for c in candidates):
                    found.add(number)
                    break
        return found

    def close_to(self, text: str, limit: int = 5) -> list[str]:
        """Demangled qualified names close to `text`, for a "did you mean"."""
        import difflib

        paths = {function_path(t) for texts in self._whole.values() for t in texts}
        return difflib.get_close_matches(text, sorted(paths), n=limit, cutoff=0.75)


def _keys_of(text: str) -> set[str]:
    keys = {squeeze(text)}
    if "[clone " in text:
        return keys
    path = function_path(text)
    keys.add(squeeze(path))
    keys.add(squeeze(without_template_arguments(path)))
    return keys
