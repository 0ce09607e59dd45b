"""A BPF ring buffer (BPF_MAP_TYPE_RINGBUF) and its user-space consumer over mmap.

Layout (kernel/bpf/ringbuf.c): the map fd maps a consumer page (read-write, `consumer_pos` at
offset 0) and, one page further, a producer page (`producer_pos` at offset 0) followed by the
data area mapped twice in a row, so a record that wraps around is still contiguous. Each record
starts with an 8-byte header: u32 length with the BUSY (not yet committed) and DISCARD bits,
and u32 page offset; records are 8-byte aligned. Programs submit with BPF_RB_NO_WAKEUP and
the consumer drains in batches on its own schedule (one wake-up per record would double the
cost of a hit).
"""

from __future__ import annotations

import mmap
import os
import struct

from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import MapType
from probescope.errors import BpfError

_POS = struct.Struct("<Q")


class RingBuffer:
    """The map and both mappings. `span()` copies everything written since the last
    `consume()`; the caller walks its records and then consumes the bytes it walked."""

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
        self._data = memoryview(self._producer)[page:]
        self._page = page

    @property
    def consumer_pos(self) -> int:
        return int(_POS.unpack_from(self._consumer, 0)[0])

    @property
    def producer_pos(self) -> int:
        return int(_POS.unpack_from(self._producer, 0)[0])

    def pending(self) -> int:
        """Bytes reserved by programs and not consumed yet (committed or not)."""
        return self.producer_pos - self.consumer_pos

    def span(self, limit: int | None = None) -> bytes:
        """A copy of the bytes between the consumer and the producer position (at most
        `limit` of them: the walk stops at the last whole record)."""
        consumer = self.consumer_pos
        length = self.producer_pos - consumer
        if length <= 0:
            return b""
        if limit is not None:
            length = min(length, limit)
        start = consumer & self.mask
        return bytes(self._data[start : start + length])

    def consume(self, nbytes: int) -> None:
        """Give `nbytes` (whole records, as walked) back to the producers."""
        if nbytes:
            _POS.pack_into(self._consumer, 0, self.consumer_pos + nbytes)

    def close(self) -> None:
        if self.fd < 0:
            return
        self._data.release()
        self._producer.close()
        self._consumer.close()
        syscall.close(self.fd)
        self.fd = -1

    def wait_readable(self, timeout: float) -> bool:
        """Block until the kernel wakes consumers or `timeout` passes (records submitted with
        BPF_RB_NO_WAKEUP never wake: callers poll)."""
        import select

        poller = select.epoll()
        try:
            poller.register(self.fd, select.EPOLLIN)
            return bool(poller.poll(timeout))
        finally:
            poller.close()

    def __repr__(self) -> str:
        return f"RingBuffer({self.name!r}, {self.size}, fd={self.fd}, pid={os.getpid()})"
