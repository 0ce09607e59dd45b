"""A BPF ring buffer (BPF_MAP_TYPE_RINGBUF) and its user-space consumer over mmap.

Layout (kernel/bpf/ringbuf.c): the map fd maps a consumer page (read-write, `consumer_pos` at
offset 0) and, one page further, a producer page (`producer_pos` at offset 0) followed by the
data area mapped twice in a row, so a record that wraps around is still contiguous. Each record
starts with an 8-byte header: u32 length with the BUSY (not yet committed) and DISCARD bits,
and u32 page offset; records are 8-byte aligned, in the order programs reserved them (one
spinlock orders reservations from every CPU). Programs submit with BPF_RB_NO_WAKEUP and the
consumer drains in batches on its own schedule (one wake-up per record would double the cost
of a hit).

Positions and headers are read with single aligned loads and the consumer position is stored
with one aligned store (native memoryviews; `struct` moves bytes one at a time), and a record
is copied only after its header was seen committed: the kernel writes a record's bytes before
it clears BUSY with a release store.
"""

from __future__ import annotations

import mmap
import os
import struct

from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import (
    RINGBUF_BUSY_BIT,
    RINGBUF_DISCARD_BIT,
    RINGBUF_HEADER_SIZE,
    MapType,
)
from probescope.errors import BpfError

_LENGTH_MASK = ~(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT) & 0xFFFFFFFF
_RUN_MINIMUM = 8  # records compared at first in one strided comparison
_PATIENCE = 32  # records walked one at a time after a run of fewer than _RUN_MINIMUM


class RingBuffer:
    """The map and both mappings. `committed()` finds how far the records are written,
    `view()` shows them, `consume_to()` gives their space back to the producers."""

    def __init__(self, name: str, size: int) -> None:
        page = mmap.PAGESIZE
        if size < page or size & (size - 1):
            raise BpfError(f"ring buffer size {size} is not a power of two of at least a page")
        self.name = name
        self.size = size
        self.mask = size - 1
        self.fd = syscall.map_create(MapType.RINGBUF, 0, 0, size, name=name)
        try:
            self._consumer = mmap.mmap(
                self.fd, page, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
            self._producer = mmap.mmap(
                self.fd,
                page + 2 * size,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ,
                offset=page,
            )
        except OSError as error:
            syscall.close(self.fd)
            raise BpfError(f"mapping ring buffer {name!r}: {error.strerror}") from None
        self._consumer_word = memoryview(self._consumer).cast("Q")
        self._producer_word = memoryview(self._producer)[:8].cast("Q")
        self._data = memoryview(self._producer)[page:]
        self._words = self._data.cast("I")  # record headers, one aligned load each
        self._page = page

    @property
    def consumer_pos(self) -> int:
        return int(self._consumer_word[0])

    @property
    def producer_pos(self) -> int:
        return int(self._producer_word[0])

    def pending(self) -> int:
        """Bytes reserved by programs and not consumed yet (committed or not)."""
        return self.producer_pos - self.consumer_pos

    def committed(self, start: int, producer: int, limit: int) -> tuple[int, int]:
        """From position `start` towards `producer` (a producer position read earlier), at
        most `limit` bytes: (the end of the records committed in a row, how many). The walk
        stops at the first record still BUSY.

        Most records of a session have one size: after a record, the headers of the next
        ones are compared with its own in one strided comparison (C speed), a run twice as
        long each time the whole run matched; where records of several sizes alternate, the
        walk goes a header at a time for a while before it tries again."""
        words, mask = self._words, self.mask
        end = min(producer, start + limit)
        position, records, patience = start, 0, 0
        while end - position >= RINGBUF_HEADER_SIZE:
            word = int(words[(position & mask) >> 2])
            if word & RINGBUF_BUSY_BIT:
                break
            step = RINGBUF_HEADER_SIZE + (((word & _LENGTH_MASK) + 7) & ~7)
            if position + step > end:
                break  # cannot happen for a committed record; never read past the producer
            position += step
            records += 1
            if patience:
                patience -= 1
                continue
            stride, pattern, trial = step >> 2, struct.pack("=I", word), _RUN_MINIMUM
            while (end - position) // step:
                count = min(trial, (end - position) // step)
                first = (position & mask) >> 2
                headers = words[first : first + count * stride : stride].tobytes()
                alike = _alike_prefix(headers, pattern)
                position += alike * step
                records += alike
                if alike < count:
                    patience = 0 if alike >= _RUN_MINIMUM else _PATIENCE
                    break
                trial *= 2
        return position, records

    def view(self, start: int, end: int) -> memoryview:
        """The bytes of positions [start, end) (at most the ring's size), contiguous."""
        offset = start & self.mask
        return self._data[offset : offset + (end - start)]

    def consume_to(self, position: int) -> None:
        """Give everything before `position` (whole records, as walked) back to the
        producers."""
        self._consumer_word[0] = position

    def close(self) -> None:
        if self.fd < 0:
            return
        self._words.release()
        self._data.release()
        self._producer_word.release()
        self._consumer_word.release()
        self._producer.close()
        self._consumer.close()
        syscall.close(self.fd)
        self.fd = -1

    def __repr__(self) -> str:
        return f"RingBuffer({self.name!r}, {self.size}, fd={self.fd}, pid={os.getpid()})"


def _alike_prefix(headers: bytes, word: bytes) -> int:
    """How many 4-byte header words at the start of `headers` equal `word` (a committed
    record of the same length): all of them, or found by bisection."""
    count = len(headers) // 4
    if headers == word * count:
        return count
    low, high = 0, count - 1  # the first `low` are alike; not all `count` are
    while low < high:
        middle = (low + high + 1) // 2
        if headers[: 4 * middle] == word * middle:
            low = middle
        else:
            high = middle - 1
    return low
