"""FETCHARG types as the kernel's `probe_fetch_types[]` knows them: names, sizes, bitfields."""

from __future__ import annotations

from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_numbers import kstrtoul, simple_strtoul

_BASIC_TYPES: dict[str, tuple[int, bool]] = {
    **{f"u{b}": (b // 8, False) for b in (8, 16, 32, 64)},
    **{f"s{b}": (b // 8, True) for b in (8, 16, 32, 64)},
    **{f"x{b}": (b // 8, False) for b in (8, 16, 32, 64)},
    "char": (1, False),
    "symbol": (8, False),
    "string": (4, False),
    "ustring": (4, False),
    "symstr": (4, False),
}
TYPE_NAMES = tuple(_BASIC_TYPES)


def parse_type(
    text: str | None, grammar: KernelGrammar, *, user: bool
) -> tuple[str, int, bool] | None:
    """`find_fetch_type`: (base type name, size, signed) or None when the kernel says BAD_TYPE
    (`user`: for a uprobe)."""
    if (
        text is not None
        and user
        and text in ("symbol", "symstr")
        and grammar.refuses_symbol_types_on_uprobes
    ):
        return None
    if text is not None and text in _BASIC_TYPES and text not in grammar.types:
        return None
    if text is None:
        text = "x64"
    if text.startswith("b"):
        slash = text.find("/")
        if slash < 0:
            return None
        container = kstrtoul(text[slash + 1 :])
        if container not in (8, 16, 32, 64):
            return None
        return f"u{container}", container // 8, False
    found = _BASIC_TYPES.get(text)
    return (text, *found) if found else None


def parse_bitfield(text: str, size: int) -> tuple[int, int, int] | None:
    """`__parse_bitfield_probe_arg`: (width, offset, container bits) or None (BAD_BITFIELD)."""
    width, n = simple_strtoul(text[1:])
    rest = text[1 + n :]
    if width == 0 or rest[:1] != "@":
        return None
    offset, m = simple_strtoul(rest[1:])
    if m == 0 or rest[1 + m : 2 + m] != "/":
        return None
    bits = size * 8
    if bits < width + offset:
        return None
    return width, offset, bits
