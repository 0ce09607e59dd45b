"""Build ring-buffer sub-buffers byte by byte, the way kernel/trace/ring_buffer.c lays them out,
for record types a live kernel rarely writes (TIME_STAMP, discarded events, big-endian words)."""

from __future__ import annotations

import struct

PADDING, TIME_EXTEND, TIME_STAMP = 29, 30, 31
MISSED_EVENTS, MISSED_STORED = 1 << 31, 1 << 30


def header_word(type_len: int, delta: int, order: str = "<") -> bytes:
    """The u32 `type_len:5 time_delta:27`: type_len in the low bits on little-endian kernels,
    in the high bits on big-endian ones."""
    assert 0 <= type_len < 32 and 0 <= delta < 1 << 27
    value = type_len | delta << 5 if order == "<" else type_len << 27 | delta
    return struct.pack(order + "I", value)


def data(payload: bytes, delta: int = 0, order: str = "<", *, long: bool = False) -> bytes:
    """A data record: type_len = words of payload (1..28), or 0 with the length in array[0]."""
    padded = payload + bytes(-len(payload) % 4)
    if not long and 0 < len(padded) <= 112:
        return header_word(len(padded) // 4, delta, order) + padded
    return header_word(0, delta, order) + struct.pack(order + "I", len(payload) + 4) + padded


def time_extend(delta: int, order: str = "<") -> bytes:
    return header_word(TIME_EXTEND, delta & (1 << 27) - 1, order) + struct.pack(
        order + "I", delta >> 27
    )


def time_stamp(stamp: int, order: str = "<") -> bytes:
    """An absolute TIME_STAMP record; only the low 59 bits are stored."""
    return header_word(TIME_STAMP, stamp & (1 << 27) - 1, order) + struct.pack(
        order + "I", (stamp >> 27) & 0xFFFFFFFF
    )


def discarded(payload_size: int, delta: int, order: str = "<") -> bytes:
    """A discarded event: PADDING with a non-zero delta and array[0] = bytes after the header."""
    body = payload_size + (-payload_size % 4)
    return header_word(PADDING, delta, order) + struct.pack(order + "I", body) + bytes(body - 4)


def null_padding(order: str = "<") -> bytes:
    return header_word(PADDING, 0, order) + bytes(4)


def sub_buffer(
    records: bytes,
    timestamp: int,
    *,
    size: int = 4096,
    order: str = "<",
    flags: int = 0,
    lost: int | None = None,
    commit: int | None = None,
) -> bytes:
    """header (u64 timestamp, u64 commit|flags) + records, zero-filled to `size`; `lost` is
    stored right after the records (RB_MISSED_STORED)."""
    length = len(records) if commit is None else commit
    body = records
    if lost is not None:
        body += struct.pack(order + "Q", lost)
    page = struct.pack(order + "QQ", timestamp, length | flags) + body
    assert len(page) <= size
    return page + bytes(size - len(page))


def uprobe_entry(
    event_id: int,
    tid: int,
    ip: int,
    args: bytes = b"",
    *,
    flags: int = 0,
    preempt: int = 0,
    order: str = "<",
) -> bytes:
    """An uprobe entry payload: common_type u16, common_flags u8, common_preempt_count u8,
    common_pid s32, __probe_ip u64, then the argument bytes."""
    return struct.pack(order + "HBBiQ", event_id, flags, preempt, tid, ip) + args


def uretprobe_entry(
    event_id: int, tid: int, func: int, ret_ip: int, args: bytes = b"", *, order: str = "<"
) -> bytes:
    """An uretprobe payload: common fields, __probe_func u64, __probe_ret_ip u64, args."""
    return struct.pack(order + "HBBiQQ", event_id, 0, 0, tid, func, ret_ip) + args
