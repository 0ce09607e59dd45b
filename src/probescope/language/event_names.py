"""Event names probescope derives: from a function's name, and numbered when two collide.

The kernel takes event names of at most 63 characters (MAX_EVENT_NAME_LEN - 1); every name made
here stays within that, whatever the number appended.
"""

from __future__ import annotations

from collections.abc import Container

MAX_EVENT_LEN = 63


def event_name_for(symbol: str, offset: int, is_return: bool) -> str:
    """A tracefs-legal event name for a probe on `symbol+offset` (perf-probe style)."""
    base = symbol.split("@", 1)[0]
    name = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in base)
    name = name or "probe"
    if name[0].isdigit():
        name = "_" + name
    if offset:
        name += f"_{offset}"
    suffix = "__return" if is_return else ""
    return name[: MAX_EVENT_LEN - len(suffix)] + suffix


def demangled_event_base(path: str) -> str:
    """The part of an event name a demangled C++/Rust name gives: its words joined by single
    underscores (`ns::Class::method` → `ns_Class_method`, `<a::S as a::T>::f` → `a_S_as_a_T_f`),
    kept to its last MAX_EVENT_LEN characters, where the function's own name is."""
    words = "".join(c if c.isascii() and (c.isalnum() or c == "_") else " " for c in path).split()
    return "_".join(words)[-MAX_EVENT_LEN:].lstrip("_") or "probe"


def numbered(name: str, number: int) -> str:
    """`NAME_NUMBER`, NAME cut so that the whole stays within MAX_EVENT_LEN."""
    suffix = f"_{number}"
    return name[: MAX_EVENT_LEN - len(suffix)] + suffix


def first_free(name: str, taken: Container[str]) -> str:
    """`name` itself when it is not taken, else the first of `name_1`, `name_2`... that is not."""
    number = 0
    candidate = name
    while candidate in taken:
        number += 1
        candidate = numbered(name, number)
    return candidate
