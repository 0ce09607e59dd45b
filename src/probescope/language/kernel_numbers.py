"""The kernel's integer parsers (kstrtoul, kstrtol, kstrtouint, simple_strtoul), bit for bit.

Probe definitions are parsed by these, so `010` is octal, `0x` needs a hex digit after it, a
leading `+` is allowed by kstrtoul, and overflow is an error. ASCII only, like the kernel's ctype.
"""

from __future__ import annotations

ULONG_MAX = (1 << 64) - 1
LONG_MAX = (1 << 63) - 1
UINT_MAX = (1 << 32) - 1

_HEX = "0123456789abcdefABCDEF"


def _fixup_radix(s: str, base: int) -> tuple[str, int]:
    if base == 0:
        if s[:1] == "0":
            base = 16 if s[1:2] in ("x", "X") and s[2:3] != "" and s[2:3] in _HEX else 8
        else:
            base = 10
    if base == 16 and s[:1] == "0" and s[1:2] in ("x", "X"):
        s = s[2:]
    return s, base


def _digit(ch: str) -> int:
    if "0" <= ch <= "9":
        return ord(ch) - 48
    low = ch.lower()
    if "a" <= low <= "f" and ch.isascii():
        return ord(low) - 87
    return 99


def _parse_integer(s: str, base: int) -> tuple[int, int]:
    """(value, digits consumed); value may exceed 64 bits (the caller checks overflow)."""
    value = 0
    n = 0
    for ch in s:
        d = _digit(ch)
        if d >= base:
            break
        value = value * base + d
        n += 1
    return value, n


def _kstrtoull_nosign(s: str, base: int) -> int | None:
    s, base = _fixup_radix(s, base)
    value, n = _parse_integer(s, base)
    if n == 0 or value > ULONG_MAX:
        return None
    rest = s[n:]
    if rest[:1] == "\n":
        rest = rest[1:]
    return None if rest else value


def kstrtoul(s: str, base: int = 0) -> int | None:
    """Unsigned 64-bit parse; None where the kernel returns -EINVAL or -ERANGE."""
    if s[:1] == "+":
        s = s[1:]
    return _kstrtoull_nosign(s, base)


def kstrtol(s: str, base: int = 0) -> int | None:
    """Signed 64-bit parse; None on error."""
    if s[:1] == "-":
        value = _kstrtoull_nosign(s[1:], base)
        if value is None or value > LONG_MAX + 1:
            return None
        return -value
    value = kstrtoul(s, base)
    if value is None or value > LONG_MAX:
        return None
    return value


def kstrtouint(s: str, base: int = 0) -> int | None:
    value = kstrtoul(s, base)
    if value is None or value > UINT_MAX:
        return None
    return value


def simple_strtoul(s: str, base: int = 0) -> tuple[int, int]:
    """(value, characters consumed including any 0x prefix), as simple_strtoul with its endp."""
    stripped, base = _fixup_radix(s, base)
    skipped = len(s) - len(stripped)
    value, n = _parse_integer(stripped, base)
    return value & ULONG_MAX, skipped + n


def is_good_name(name: str) -> bool:
    """`[A-Za-z_][A-Za-z0-9_]*`, the kernel's is_good_name()."""
    if not name or not (name[0] == "_" or (name[0].isascii() and name[0].isalpha())):
        return False
    return all(c == "_" or (c.isascii() and c.isalnum()) for c in name[1:])


def is_good_system_name(name: str) -> bool:
    """Group names: like is_good_name, but `-` is allowed anywhere (verified on 6.18)."""
    if not name or not (name[0] in "_-" or (name[0].isascii() and name[0].isalpha())):
        return False
    return all(c in "_-" or (c.isascii() and c.isalnum()) for c in name[1:])


def is_ascii_digit(ch: str) -> bool:
    return len(ch) == 1 and "0" <= ch <= "9"
