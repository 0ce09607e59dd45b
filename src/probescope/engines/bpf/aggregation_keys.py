"""How an in-kernel aggregation lays out its map keys and values, and how user space reads
them back.

A key is built on the program's stack and compared as bytes by the hash map, so every byte of
it is written (zeroed first). Its parts, each at an 8-byte aligned offset:

    offset  size  part
    0       4     probe index (the uprobe_multi cookie; a tracepoint program's constant)
    4       4     tgid, when the key holds `pid` or a user stack (which needs its process)
    8 ...         the key fields in order: tid, cpu (u32 in 8), comm (16), an argument or
                  the return value (u64 as the kernel stores it), ustack (s64 stack id, then
                  the return address at [sp] of a probe at a function's first byte), kstack
                  (s64 stack id)

A value is one u64 count, or (histograms, latency) the bucket counts, then count, sum, min
and max — u64 words, min and max signed when the histogram's argument is. Per-CPU maps give
user space one such value per possible CPU.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from probescope.engines.aggregation import KernelAggregation
from probescope.errors import BpfError

MAX_KEY_SIZE = 256
"""Keys live on the program's 512-byte stack beside its other slots."""
COMM_SIZE = 16
PID_OFFSET = 4
FIELDS_OFFSET = 8
_SIZES = {"comm": 16, "ustack": 16}
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class KeyPart:
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class KeyLayout:
    """Where each key field sits; `with_pid` when the tgid is kept at PID_OFFSET."""

    parts: tuple[KeyPart, ...]
    size: int
    with_pid: bool

    @classmethod
    def of(cls, fields: tuple[str, ...]) -> KeyLayout:
        parts = []
        offset = FIELDS_OFFSET
        for name in fields:
            if name in ("probe", "pid"):
                continue  # at offsets 0 and PID_OFFSET
            size = _SIZES.get(name, 8)
            parts.append(KeyPart(name, offset, size))
            offset += size
        if offset > MAX_KEY_SIZE:
            raise BpfError(
                f"a key of {', '.join(fields)} takes {offset} bytes; in-kernel keys hold at "
                f"most {MAX_KEY_SIZE}"
            )
        return cls(tuple(parts), offset, "pid" in fields or "ustack" in fields)

    def part(self, name: str) -> KeyPart | None:
        return next((p for p in self.parts if p.name == name), None)

    def read(self, key: bytes) -> tuple[int, int | None, dict[str, object]]:
        """(probe index, tgid or None, raw parts by name): integers as stored (u64), comm as
        text, ustack as (stack id, return address), kstack as its stack id."""
        probe, pid = struct.unpack_from("<II", key)
        parts: dict[str, object] = {}
        for part in self.parts:
            if part.name == "comm":
                raw = key[part.offset : part.offset + COMM_SIZE].split(b"\0", 1)[0]
                parts[part.name] = raw.decode("utf-8", "surrogateescape")
            elif part.name == "ustack":
                parts[part.name] = struct.unpack_from("<qQ", key, part.offset)
            elif part.name == "kstack":
                parts[part.name] = struct.unpack_from("<q", key, part.offset)[0]
            elif part.name in ("tid", "cpu"):
                parts[part.name] = struct.unpack_from("<I", key, part.offset)[0]
            else:
                parts[part.name] = struct.unpack_from("<Q", key, part.offset)[0]
        return probe, pid if self.with_pid else None, parts


def as_typed(raw: int, size: int, signed: bool) -> int:
    """A u64 word holding a value of `size` bytes as the kernel stores it, as the event
    decoder reads that value (sign-extended when signed)."""
    bits = 8 * size
    raw &= (1 << bits) - 1
    if signed and raw >> (bits - 1):
        raw -= 1 << bits
    return raw


@dataclass(frozen=True)
class ValueLayout:
    """The words of one CPU's value: `buckets` bucket counts (0 for a count), then count,
    sum, min, max. `signed`: the histogram's values (and so sum, min, max) are signed."""

    buckets: int
    signed: bool = False

    @classmethod
    def of(cls, aggregation: KernelAggregation, signed: bool = False) -> ValueLayout:
        return cls(aggregation.buckets, signed and aggregation.kind == "hist")

    @property
    def words(self) -> int:
        return 1 if not self.buckets else self.buckets + 4

    @property
    def size(self) -> int:
        return 8 * self.words

    @property
    def count_offset(self) -> int:
        return 8 * self.buckets

    @property
    def sum_offset(self) -> int:
        return 8 * self.buckets + 8

    @property
    def min_offset(self) -> int:
        return 8 * self.buckets + 16

    @property
    def max_offset(self) -> int:
        return 8 * self.buckets + 24

    def read(self, value: bytes) -> tuple[int | None, ...]:
        """One CPU's words: a count, or buckets, count, sum, min, max (min and max None when
        this CPU counted nothing)."""
        words: list[int | None] = list(struct.unpack_from(f"<{self.words}Q", value))
        if not self.buckets:
            return tuple(words)
        count, total, low, high = words[-4:]
        assert count is not None and total is not None and low is not None and high is not None
        words[-3] = as_typed(total, 8, self.signed)
        if count:
            words[-2] = extreme_value(low ^ _U64_MAX, self.signed)
            words[-1] = extreme_value(high, self.signed)
        else:
            words[-2] = words[-1] = None
        return tuple(words)


def extreme_word(value: int, signed: bool, *, inverted: bool) -> int:
    """How a program keeps a min (`inverted`) or max: a word whose unsigned order follows
    the value's (the sign bit flipped for signed values; all bits flipped for a min), so
    that 0 is the neutral start and both only grow."""
    word = value & _U64_MAX
    if signed:
        word ^= 1 << 63
    return word ^ _U64_MAX if inverted else word


def extreme_value(word: int, signed: bool) -> int:
    """The value of a max word (or of a min word with its bits flipped back)."""
    if signed:
        return as_typed(word ^ (1 << 63), 8, True)
    return word
