"""Machine-code templates with holes, and how a hole is filled when a template is placed.

The fentry engine never assembles anything at run time: stubs.S is assembled at development
time (tools/fentry_templates.py) into templates.py, a table of Template values. A hole is what
the assembler left as a relocation: a symbol the source does not define (a header field of the
code area, the site word) or defines in another template (a call from a site stub into the
common code). Placing a template computes each hole's value as a linker would.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from probescope.errors import PtraceError

PC32 = "pc32"  # R_X86_64_PC32 / R_X86_64_PLT32: S + A - P, signed 32 bits
ABS32 = "abs32"  # R_X86_64_32: S + A, unsigned 32 bits
ABS32S = "abs32s"  # R_X86_64_32S: S + A, signed 32 bits
ABS64 = "abs64"  # R_X86_64_64: S + A


@dataclass(frozen=True)
class Hole:
    """One relocation left in a template: fill `symbol + addend` at `offset`."""

    offset: int
    kind: str
    symbol: str
    addend: int


@dataclass(frozen=True)
class Template:
    """The bytes of one section of stubs.S, its global labels and its holes."""

    name: str
    code: bytes
    symbols: Mapping[str, int] = field(default_factory=dict)
    holes: tuple[Hole, ...] = ()

    def __len__(self) -> int:
        return len(self.code)

    def place(self, address: int, resolve: Callable[[str], int]) -> bytes:
        """The bytes to copy to `address`, every hole filled through `resolve(symbol)`."""
        out = bytearray(self.code)
        for hole in self.holes:
            value = resolve(hole.symbol) + hole.addend
            if hole.kind == PC32:
                value -= address + hole.offset
                _pack(out, hole, "<i", value)
            elif hole.kind == ABS32:
                _pack(out, hole, "<I", value)
            elif hole.kind == ABS32S:
                _pack(out, hole, "<i", value)
            elif hole.kind == ABS64:
                _pack(out, hole, "<Q", value & (1 << 64) - 1)
            else:
                raise PtraceError(f"template {self.name}: unknown hole kind {hole.kind!r}")
        return bytes(out)


def _pack(out: bytearray, hole: Hole, fmt: str, value: int) -> None:
    try:
        struct.pack_into(fmt, out, hole.offset, value)
    except struct.error:
        raise PtraceError(
            f"hole {hole.symbol}{hole.addend:+d} at +{hole.offset:#x} cannot hold {value:#x} "
            "(out of reach of the code area)"
        ) from None
