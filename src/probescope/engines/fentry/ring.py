"""The shared ring: the records the stubs write, as the tracer maps and drains it.

A memfd the traced program creates (through an injected system call) and maps MAP_SHARED; the
tracer opens it through /proc/PID/fd and maps it too, so records written just before the
program exits are still read, and a fork child writes into the same ring. Multi-producer:
a stub reserves a ticket with `lock cmpxchg` on the head unless the ring is full (then it
counts a drop), fills the 128-byte record and stores `ticket + 1` into its commit word last.
The tracer reads the commit words first and then the records they vouch for, so a record is
never taken half-written; it then advances the tail. A record whose writer died mid-write
(the process was killed) is skipped and counted lost once later records wait behind it for
`STUCK_SECONDS`.

The header also holds the handshake slot (see stubs.S `handshake`): the request a stub posts
when the tracer must act before the program goes on, and the tracer's acknowledgement.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

from probescope.engines.fentry.templates import CONSTANTS

RING_MAGIC = 0x676E69722D667370  # "psf-ring"
RING_DATA = CONSTANTS["RING_DATA"]
RECORD_SIZE = 1 << CONSTANTS["RECORD_SHIFT"]
_HEAD = CONSTANTS["RING_HEAD"]
_TAIL = CONSTANTS["RING_TAIL"]
_DROPS = CONSTANTS["RING_DROPS"]
_OMITTED = CONSTANTS["RING_OMITTED"]
_MASK = CONSTANTS["RING_MASK"]
_RECORDS = CONSTANTS["RING_RECORDS"]
_STATE = CONSTANTS["RING_STATE"]
_LOCK = CONSTANTS["RING_LOCK"]
_REQ_KIND = CONSTANTS["RING_REQ_KIND"]
_REQ_SEQ = CONSTANTS["RING_REQ_SEQ"]
_ACK_SEQ = CONSTANTS["RING_ACK_SEQ"]
_WORDS_PER_RECORD = RECORD_SIZE // 4
STUCK_SECONDS = 1.0

# commit, site, tid, pid, tsc, cpu, reserved, aux, rdi rsi rdx rcx r8 r9 rax rsp stack0..2
RECORD = struct.Struct("<IIIIQIIQ11Q")
assert RECORD.size == RECORD_SIZE


_FIELDS = [("I", 4)] * 4 + [("Q", 8), ("I", 4), ("I", 4)] + [("Q", 8)] * 12


def compact_layout(needed: set[int]) -> tuple[struct.Struct, dict[int, int]]:
    """A record layout that unpacks only the fields `needed` (positions in RECORD's tuple),
    and where each of them lands in the shorter tuple."""
    fmt = "<"
    where: dict[int, int] = {}
    for index, (code, size) in enumerate(_FIELDS):
        if index in needed:
            where[index] = len(where)
            fmt += code
        else:
            fmt += f"{size}x"
    layout = struct.Struct(fmt)
    assert layout.size == RECORD_SIZE
    return layout, where


def ring_bytes(records: int) -> int:
    return RING_DATA + records * RECORD_SIZE


@dataclass
class Request:
    """A handshake a stub is waiting on."""

    sequence: int
    kind: int  # the site word of the hook (F_DLOPEN or F_EXEC set)
    tid: int
    pid: int


class Ring:
    """Our mapping of one ring, and the reader's position in it."""

    def __init__(self, fd: int, records: int, name: str) -> None:
        if records & (records - 1):
            raise ValueError("ring records must be a power of two")
        self.name = name
        self.records = records
        self.size = ring_bytes(records)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._map = mmap.mmap(fd, self.size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        # words read and written through native memoryviews: one aligned load or store each
        # (struct's little-endian "<Q" moves byte by byte, and a stub reading a torn tail
        # while it changes would see a full ring)
        self._words = memoryview(self._map).cast("I")
        self._qwords = memoryview(self._map).cast("Q")
        self.tail = 0
        self._drops_seen = 0
        self._stuck_since: float | None = None
        self.lost_stuck = 0
        self.closed = False

    @classmethod
    def open_from(cls, pid: int, fd: int, records: int, name: str) -> Ring:
        """Map the ring the program holds as its descriptor `fd`."""
        ours = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            return cls(ours, records, name)
        finally:
            os.close(ours)

    def initialize(self) -> None:
        """Write the header the stubs read (before any stub can run)."""
        self._qwords[0] = RING_MAGIC
        self._qwords[_MASK // 8] = self.records - 1
        self._qwords[_RECORDS // 8] = self.records
        self._words[_STATE // 4] = 1

    # -- state words -------------------------------------------------------------------------

    def _u64(self, offset: int) -> int:
        return int(self._qwords[offset // 8])

    @property
    def head(self) -> int:
        return self._u64(_HEAD)

    @property
    def drops(self) -> int:
        return self._u64(_DROPS)

    @property
    def omitted(self) -> int:
        return self._u64(_OMITTED)

    @property
    def serving(self) -> bool:
        return bool(self._words[_STATE // 4])

    def stop_serving(self) -> None:
        """No more handshakes: stubs go on without waiting for a tracer."""
        if not self.closed:
            self._words[_STATE // 4] = 0

    def pending_request(self) -> Request | None:
        if self.closed:
            return None
        sequence = self._u64(_REQ_SEQ)
        if sequence <= self._u64(_ACK_SEQ):
            return None
        kind, tid, pid = struct.unpack_from("<III", self._map, _REQ_KIND)
        return Request(sequence, kind, tid, pid)

    def acknowledge(self, request: Request) -> None:
        self._qwords[_ACK_SEQ // 8] = request.sequence

    def lock_owner(self) -> int:
        return int(self._words[_LOCK // 4])

    def break_lock(self, owner: int) -> None:
        """Free the request slot held by a thread that no longer exists."""
        if self.lock_owner() == owner:
            self._words[_LOCK // 4] = 0

    # -- records -----------------------------------------------------------------------------

    def pending(self) -> int:
        return max(0, self.head - self.tail)

    def read(
        self, limit: int = 65536, layout: struct.Struct = RECORD
    ) -> tuple[list[tuple[int, ...]], int]:
        """(records, lost since the last call), at most `limit` records, each unpacked with
        `layout` (RECORD, or a compact_layout() that skips the fields nobody reads)."""
        if self.closed:
            return [], 0
        drops = self.drops
        lost = drops - self._drops_seen
        self._drops_seen = drops
        tail = self.tail
        available = min(self.head - tail, limit)
        if available <= 0:
            self._stuck_since = None
            return [], lost
        out: list[tuple[int, ...]] = []
        taken = 0
        while taken < available:
            index = (tail + taken) & (self.records - 1)
            count = min(available - taken, self.records - index)
            ready = self._committed(tail + taken, index, count)
            if ready:
                start = RING_DATA + index * RECORD_SIZE
                out.extend(layout.iter_unpack(self._map[start : start + ready * RECORD_SIZE]))
                taken += ready
            if ready < count:
                break
        if taken == 0 and available:
            now = time.monotonic()
            if self._stuck_since is None:
                self._stuck_since = now
            elif now - self._stuck_since > STUCK_SECONDS:
                taken = 1  # its writer died mid-record: skip it
                self.lost_stuck += 1
                lost += 1
                self._stuck_since = None
        else:
            self._stuck_since = None
        if taken:
            self.tail = tail + taken
            self._qwords[_TAIL // 8] = self.tail
        return out, lost

    def _committed(self, ticket: int, index: int, count: int) -> int:
        """How many records from `index` on carry the commit words of tickets `ticket`..."""
        first = RING_DATA // 4 + index * _WORDS_PER_RECORD
        commits = self._words[first : first + count * _WORDS_PER_RECORD : _WORDS_PER_RECORD]
        expected = (ticket + 1) & 0xFFFFFFFF
        if commits[0] != expected:
            return 0
        if expected + count <= 0x100000000 and commits.tolist() == list(
            range(expected, expected + count)
        ):
            return count
        for position, value in enumerate(commits.tolist()):
            if value != (ticket + 1 + position) & 0xFFFFFFFF:
                return position
        return count

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._words.release()
        self._qwords.release()
        self._map.close()
