"""A kernel's enum constants and integer typedefs, from its BTF (`KernelTypes`).

Print fmts name what the kernel compiled in: enum constants its TRACE_EVENT did not export and
typedefs in casts. The BTF of the kernel that wrote the events has them all.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

from probescope.errors import RingBufferFormatError


class KernelTypes:
    """Enum constants and integer typedefs of a kernel, from its BTF.

    Format files keep an enum constant as a name when its TRACE_EVENT did not export it with
    TRACE_DEFINE_ENUM (`{ I_DIRTY_SYNC, "I_DIRTY_SYNC" }`, `HRTIMER_MODE_ABS`); the kernel's
    own printer has the value compiled in. `/sys/kernel/btf/vmlinux` (CONFIG_DEBUG_INFO_BTF)
    has every enum of the kernel that wrote the format, so names resolve to what that kernel
    uses. Typedef names in casts (`(__kernel_rwf_t)`) resolve through it too.
    """

    def __init__(self, enums: Mapping[str, int], typedefs: Mapping[str, tuple[int, bool]]) -> None:
        self.enums = dict(enums)
        self.typedefs = dict(typedefs)

    @classmethod
    def from_btf(cls, data: bytes) -> KernelTypes:
        """Parse raw BTF (`struct btf_header`, type and string sections, include/uapi/linux/
        btf.h): ENUM and ENUM64 members, and TYPEDEFs that end in an integer or enum."""
        try:
            return cls._parse(data)
        except struct.error as error:
            raise RingBufferFormatError(f"BTF data is truncated: {error}") from None

    @classmethod
    def _parse(cls, data: bytes) -> KernelTypes:
        if len(data) < 24:
            raise RingBufferFormatError("BTF data is shorter than its header")
        magic, _version, _flags, header_length = struct.unpack_from("<HBBI", data, 0)
        if magic != 0xEB9F:
            raise RingBufferFormatError(f"BTF magic is {magic:#x}, expected 0xeb9f")
        type_offset, type_length, string_offset, string_length = struct.unpack_from(
            "<IIII", data, 8
        )
        types = data[header_length + type_offset : header_length + type_offset + type_length]
        strings = data[
            header_length + string_offset : header_length + string_offset + string_length
        ]

        def name(offset: int) -> str:
            end = strings.find(b"\0", offset)
            return strings[offset : end if end >= 0 else len(strings)].decode("ascii", "replace")

        enums: dict[str, int] = {}
        ambiguous: set[str] = set()
        kinds: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]  # kind, size/type, signed, name
        position = 0
        while position + 12 <= len(types):
            name_offset, info, size_or_type = struct.unpack_from("<III", types, position)
            position += 12
            kind = (info >> 24) & 0x1F
            count = info & 0xFFFF
            signed = 0
            if kind == _BTF_INT:
                encoding = struct.unpack_from("<I", types, position)[0]
                signed = 1 if (encoding >> 24) & 1 else 0
            elif kind in (_BTF_ENUM, _BTF_ENUM64):
                signed = 1 if info >> 31 else 0
                step = 8 if kind == _BTF_ENUM else 12
                for member in range(count):
                    at = position + member * step
                    if kind == _BTF_ENUM:
                        member_name, value = struct.unpack_from("<II", types, at)
                        if signed and value >> 31:
                            value -= 1 << 32
                    else:
                        member_name, low, high = struct.unpack_from("<III", types, at)
                        value = high << 32 | low
                        if signed and value >> 63:
                            value -= 1 << 64
                    label = name(member_name)
                    if enums.get(label, value) != value:
                        ambiguous.add(label)
                    enums[label] = value
            kinds.append((kind, size_or_type, signed, name_offset))
            position += _BTF_FIXED.get(kind, 0) + _BTF_PER_MEMBER.get(kind, 0) * count
        for label in ambiguous:
            del enums[label]
        typedefs: dict[str, tuple[int, bool]] = {}
        for kind, target, _signed, name_offset in kinds:
            if kind != _BTF_TYPEDEF:
                continue
            for _ in range(16):
                if not 0 < target < len(kinds):
                    break
                inner, size_or_type, inner_signed, _ = kinds[target]
                if inner in (_BTF_TYPEDEF, _BTF_CONST, _BTF_VOLATILE, _BTF_RESTRICT):
                    target = size_or_type
                    continue
                if inner in (_BTF_INT, _BTF_ENUM, _BTF_ENUM64) and size_or_type in (1, 2, 4, 8):
                    typedefs[name(name_offset)] = (size_or_type, bool(inner_signed))
                break
        return cls(enums, typedefs)

    @classmethod
    def from_path(cls, path: str | Path) -> KernelTypes:
        """The types of a raw BTF file (a kernel's `/sys/kernel/btf/vmlinux`, or a copy)."""
        with open(path, "rb") as stream:
            return cls.from_btf(stream.read())


_BTF_INT, _BTF_TYPEDEF, _BTF_VOLATILE, _BTF_CONST, _BTF_RESTRICT = 1, 8, 9, 10, 11
_BTF_ENUM, _BTF_ENUM64 = 6, 19
_BTF_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_BTF_PER_MEMBER = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}
