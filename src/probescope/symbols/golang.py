"""Go binaries: which toolchain linked them, and whether a function takes Go's register ABI.

Since Go 1.17 (amd64) and 1.18 (arm64, ppc64, riscv64...) functions written in Go take their
arguments in registers, in Go's own order — amd64: `ax bx cx di si r8 r9 r10 r11`, arm64:
`x0`…`x15` — one register per word, so a string takes two (pointer, length) and a slice three.
Functions written in assembly keep the stack-based ABI0 (the linker names the ABI0 wrapper of
a Go function `NAME.abi0`). The toolchain's version is read from `.go.buildinfo`: since Go
1.18 it is written there inline; Go 1.17 and older keep pointers there instead, and the
version string is looked for in the read-only data.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from probescope.symbols.elfimage import ElfImage

_MAGIC = b"\xff Go buildinf:"
_INLINE_VERSION = 0x2
_VERSION = re.compile(rb"go1\.(\d+)(?:\.\d+)?")
EM_X86_64 = 62
# (first Go minor version with the register ABI) per ELF machine
_REGISTER_ABI_SINCE = {EM_X86_64: 17, 183: 18, 21: 18, 243: 18, 20: 18}


def go_version(image: ElfImage) -> str | None:
    """`go1.19.8`, as the toolchain wrote it, or None when it cannot be found."""
    section = image.section(".go.buildinfo")
    if section is None:
        return None
    data = image.section_data(section)
    if not data.startswith(_MAGIC) or len(data) < 33:
        return None
    if data[15] & _INLINE_VERSION:
        length, start = _uvarint(data, 32)
        text = data[start : start + length]
        return text.decode("ascii", "replace") if _VERSION.match(text) else None
    rodata = image.section(".rodata")
    if rodata is None:
        return None
    found = _VERSION.search(image.section_data(rodata))
    return found.group().decode("ascii") if found else None


def uses_register_abi(version: str | None, machine: int, function: str) -> bool:
    """Whether `function` of a Go binary of `version` takes its arguments in registers."""
    if version is None or function.endswith(".abi0"):
        return False
    since = _REGISTER_ABI_SINCE.get(machine)
    found = _VERSION.match(version.encode("ascii", "replace"))
    return since is not None and found is not None and int(found.group(1)) >= since


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    """Go's unsigned varint at `offset`: (value, offset after it)."""
    value = shift = 0
    while offset < len(data):
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    return value, offset
