"""Demangled names: C++ (Itanium) and Rust (legacy and v0) symbols as people write them.

The spelling is binutils' `nm -C` (`c++filt -i`): `std::istream::gcount() const`, Rust paths
without their hash or crate disambiguators. C++ goes through GCC's own demangler
(`__cxa_demangle` in libstdc++, by the `cxxfilt` package) and Rust through the Rust project's
(rustc-demangle, by `pyderust`); bench/bench_demangle.py measured them, and the alternatives,
against `c++filt`. Nothing here parses a mangled name itself.

Also the two text rules the symbol tables need to accept what a user types: `squeeze` (spaces
that separate no two words do not count: `vector<int, allocator<int> >` is
`vector<int,allocator<int>>`) and `function_path` (a demangled function without its return
type, parameters and qualifiers: `ns::Class::method`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# `_ZN…17h<16 hex digits>E`: a Rust legacy name (an Itanium nested name whose last part is the
# hash), optionally followed by an LLVM suffix such as `.llvm.1234`.
_RUST_LEGACY = re.compile(r"_ZN.*17h[0-9a-f]{16}E(\.[\w.$]*)?")
_MANGLED_PREFIXES = ("_Z", "_R")

_demanglers: dict[str, Callable[[str], str | None]] = {}


def is_mangled(name: str) -> bool:
    """Whether `name` looks like an Itanium (`_Z…`) or Rust v0 (`_R…`) mangled name."""
    return name.startswith(_MANGLED_PREFIXES) and len(name) > 2


def demangle(name: str) -> str | None:
    """`name` as `nm -C` spells it, or None when it is not a mangled name a demangler reads.

    A symbol version (`name@VER`, `name@@VER`) is kept after the demangled name.
    """
    if not is_mangled(name):
        return None
    plain, at, version = name.partition("@")
    if plain.startswith("_R") or _RUST_LEGACY.fullmatch(plain):
        text = _demangler("rust")(plain)
    else:
        text = _demangler("c++")(plain)
    if text is None or text == plain:
        return None
    return f"{text}{at}{version}"


def _demangler(language: str) -> Callable[[str], str | None]:
    """The library function for `language`, imported on first use (cxxfilt looks libstdc++
    up when imported, which takes tens of milliseconds)."""
    known = _demanglers.get(language)
    if known is not None:
        return known
    made = _rust_demangler() if language == "rust" else _itanium_demangler()
    _demanglers[language] = made
    return made


def _itanium_demangler() -> Callable[[str], str | None]:
    try:
        import cxxfilt
    except ImportError:  # pragma: no cover - a dependency of the package
        return _unreadable
    library: Any = cxxfilt

    def read(name: str) -> str | None:
        try:
            return str(library.demangle(name))
        except library.Error:  # not a valid name, or libstdc++ not found
            return None

    return read


def _rust_demangler() -> Callable[[str], str | None]:
    try:
        import pyderust
    except ImportError:  # pragma: no cover - a dependency of the package
        return _unreadable

    def read(name: str) -> str | None:
        try:
            return pyderust.demangle(name)
        except ValueError:  # pyderust.DemangleError
            return None

    return read


def _unreadable(name: str) -> str | None:
    return None


def squeeze(text: str) -> str:
    """`text` without the spaces that separate no two words: how two spellings of one C++
    name compare (`foo(int, char const*)` ≡ `foo(int,char const*)`, `> >` ≡ `>>`)."""
    if " " not in text:
        return text
    words = text.split()
    kept = words[:1]
    for word in words[1:]:
        if _is_word(kept[-1][-1]) and _is_word(word[0]):
            kept.append(" ")
        kept.append(word)
    return "".join(kept)


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


_OPERATOR = re.compile(r"operator(?![\w])")
_CLONE_SUFFIX = re.compile(r"( \[clone [^\]]*\])+$")
_TRAILING_QUALIFIERS = re.compile(r"(\s*(const|volatile|&&|&|noexcept))+$")


def function_path(demangled: str) -> str:
    """The qualified name of a demangled function: no `[clone .cold]`, no qualifiers after the
    parameters, no parameter list and no return type (`int ns::add<int>(int, int) const` →
    `ns::add<int>`). Rust names come back unchanged; text it cannot split is returned whole."""
    text = _CLONE_SUFFIX.sub("", demangled)
    stripped = _TRAILING_QUALIFIERS.sub("", text)
    if stripped.endswith(")"):
        opening = _matching_open_paren(stripped)
        if opening > 0:
            text = stripped[:opening]
    space = _last_top_level_space(text)
    return text[space + 1 :] if space >= 0 else text


def without_template_arguments(path: str) -> str:
    """`ns::add<int>` → `ns::add`, `r::total::<r::Square>` → `r::total`; else `path`."""
    if not path.endswith(">") or path.endswith("operator>") or path.endswith("operator>>"):
        return path
    depth = 0
    for index in range(len(path) - 1, -1, -1):
        char = path[index]
        if char == ">":
            depth += 1
        elif char == "<":
            depth -= 1
            if depth == 0:
                head = path[:index].rstrip()
                head = head[:-2] if head.endswith("::") else head
                return head if head and not head.endswith("operator") else path
    return path


def _matching_open_paren(text: str) -> int:
    depth = 0
    for index in range(len(text) - 1, -1, -1):
        char = text[index]
        if char == ")":
            depth += 1
        elif char == "(":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _last_top_level_space(text: str) -> int:
    """The last space outside <> and () — where a template function's return type ends.

    The scan stops at an `operator` keyword: what follows (`<<`, `()`, ` new`, ` bool`) is
    the name, whatever brackets or spaces it holds."""
    depth = 0
    found = -1
    for index, char in enumerate(text):
        if char == "o" and _OPERATOR.match(text, index) and (index == 0 or text[index - 1] in ": "):
            break
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth = max(depth - 1, 0)
        elif char == " " and depth == 0:
            found = index
    return found
