"""The smallest BTF a program with callbacks needs: the verifier accepts a `bpf_loop` callback
only when every function of the program is described (`func_info`: instruction offset → a
BTF FUNC). Programs without subprograms load with no BTF at all.

BTF (Documentation/bpf/btf.rst): a 24-byte header (magic 0xeB9F, version 1, flags, header
length, then type and string section offsets and lengths), `struct btf_type` records of
name_off, info (kind << 24 | vlen), size-or-type, each kind followed by its own data; type ids
count from 1. Here: one `long` INT, one FUNC_PROTO `long (long, long)` and a static FUNC per
function.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

BTF_MAGIC = 0xEB9F
BTF_KIND_INT = 1
BTF_KIND_FUNC = 12
BTF_KIND_FUNC_PROTO = 13
BTF_INT_SIGNED = 1 << 0
BTF_FUNC_STATIC = 0
FUNC_INFO_RECORD = struct.Struct("<II")  # insn_off, type_id


def function_btf(names: Sequence[str]) -> bytes:
    """A BTF blob describing functions `names` (type ids 3, 4, ... in that order)."""
    strings = bytearray(b"\0")

    def name(text: str) -> int:
        offset = len(strings)
        strings.extend(text.encode() + b"\0")
        return offset

    types = bytearray()
    # [1] INT long: 64 bits, signed
    types += struct.pack("<III", name("long"), BTF_KIND_INT << 24, 8)
    types += struct.pack("<I", (BTF_INT_SIGNED << 24) | 64)
    # [2] FUNC_PROTO long (long, long)
    types += struct.pack("<III", 0, (BTF_KIND_FUNC_PROTO << 24) | 2, 1)
    types += struct.pack("<II", name("a"), 1) + struct.pack("<II", name("b"), 1)
    # [3..] FUNC name -> proto 2
    for function in names:
        types += struct.pack("<III", name(function), (BTF_KIND_FUNC << 24) | BTF_FUNC_STATIC, 2)
    header = struct.pack("<HBBIIIII", BTF_MAGIC, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + bytes(types) + bytes(strings)


def func_info_records(starts: Sequence[int]) -> bytes:
    """`func_info` for functions starting at these instruction offsets (type ids from 3)."""
    return b"".join(FUNC_INFO_RECORD.pack(start, 3 + i) for i, start in enumerate(starts))
