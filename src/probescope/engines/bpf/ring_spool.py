"""Keep the BPF ring buffer empty while the decoder works behind, and say when events can be
released in exact time order.

A recorder process (`engines/spool.py`, the tracefs engine's too) shares the ring's mappings
across fork, walks the committed records, copies them into an unlinked spool file and
advances the ring's consumer position, a few milliseconds apart: the ring only absorbs the
recorder's scheduling delays, the spool the decoder's (a million hits a second for ten
seconds is 720 MB the ring could never hold).

Time order. The ring holds records in the order programs reserved their space, and every
program reads the clock only after its reservation (`program.emit_stamped_output`). So a
record reserved after the recorder read the producer position carries a later time than the
recorder's clock read just before that. Each round the recorder reads the clock (T), then the
producer position (P); once every record before P is committed and copied, no record still to
come can be older than T: the round's watermark (T minus WATERMARK_MARGIN, for the store of
the producer position still on its way to the recorder's CPU when the writer's clock was
read). The recorder logs `(spooled bytes, watermark)` beside the spool; the decoder, having
read the spool up to an entry's byte count, releases every event not younger than its
watermark, sorted, and holds the rest.
"""

from __future__ import annotations

import select
import struct
import time
from collections import deque

from probescope.engines.bpf.ringbuf import RingBuffer
from probescope.engines.spool import Recorder, SpoolFile

CLOCK_IDS = {"mono": time.CLOCK_MONOTONIC, "boot": time.CLOCK_BOOTTIME}
"""The clock of each trace clock the programs read (bpf_ktime_get_ns, _boot_ns)."""
WATERMARK_MARGIN = 1_000_000
"""ns: far more than a store takes to reach another CPU or the fast clock accessors differ."""
RECORDER_INTERVAL = 0.005
"""Seconds between two rounds of the recorder: long enough that it reads the ring far behind
the writers (no cache line bounced per record), short against the ring's half a second."""
COPY_LIMIT = 8 << 20
"""Bytes copied in one round at most (a bounded write; the next round starts at once)."""
RELEASE_EVERY = 4 << 20
"""Spool bytes consumed between two hole punches."""

_LOG = struct.Struct("=QQ")  # spool bytes written, watermark (ns)
_WRITTEN, _RECORDS, _ENTRIES = 0, 1, 2  # the recorder's published counters
_LOG_BLOCK = 4096  # log entries read at a time


class RingSpool:
    """The ring's records through a recorder process into a spool file.

    `start()` forks the recorder; `read(limit)` gives the next spooled bytes (whole records
    and perhaps the start of one), `advance(consumed, records)` moves past what the decoder
    walked, and `watermark` is then the time no unread record is older than. `finish()` asks
    the recorder to empty the ring and exit; `finished` is true once it has and the spool was
    read to its end. `more` says a read left spooled bytes unread."""

    def __init__(self, ring: RingBuffer, clock: str = "mono", interval: float = 0.1) -> None:
        self.ring = ring
        self.clock_id = CLOCK_IDS[clock]
        self.interval = interval
        self.final_drain_seconds = 1.0
        self.position = 0  # spool bytes the decoder walked
        self.records_read = 0
        self.watermark = 0
        self.more = False
        self.peak_backlog = 0  # the most spool bytes ever ahead of the decoder
        self._log_read = 0
        self._log: deque[tuple[int, int]] = deque()
        self._released = 0
        self._data: SpoolFile | None = None
        self._order: SpoolFile | None = None
        self._recorder: Recorder | None = None
        try:
            self._data = SpoolFile()
            self._order = SpoolFile()
            self._recorder = Recorder(counters=3, interval=interval)
        except OSError:
            self.close()
            raise

    @property
    def recorder_pid(self) -> int | None:
        return self._recorder.pid if self._recorder is not None else None

    # -- the recorder (child) -------------------------------------------------------------

    def start(self) -> None:
        assert self._recorder is not None and self._data is not None and self._order is not None
        self._recorder.start(self._record, {self._data.fd, self._order.fd})

    def _record(self) -> None:
        assert self._recorder is not None and self._data is not None and self._order is not None
        recorder, ring, data, order = self._recorder, self.ring, self._data, self._order
        clock = self.clock_id
        consumer = ring.consumer_pos
        written = records = entries = 0
        logged_watermark = last_copy = 0
        finishing_since: float | None = None
        limit = min(COPY_LIMIT, ring.size)
        while True:
            now = time.clock_gettime_ns(clock)
            producer = ring.producer_pos
            end, count = ring.committed(consumer, producer, limit)
            if count:
                data.write_at(ring.view(consumer, end), written)
                ring.consume_to(end)
                written += end - consumer
                records += count
                consumer = end
                last_copy = time.clock_gettime_ns(clock)
                recorder.publish(_RECORDS, records)
                recorder.publish(_WRITTEN, written)
            caught_up = end == producer
            logged = caught_up and (count > 0 or logged_watermark <= last_copy)
            if logged:
                # once after the last copy too, with a watermark past every record copied
                logged_watermark = now - WATERMARK_MARGIN
                order.write_at(_LOG.pack(written, logged_watermark), entries * _LOG.size)
                entries += 1
                recorder.publish(_ENTRIES, entries)
            if count or logged:
                recorder.notify()
            if count and producer - end >= limit // 2:
                continue  # a round's worth is waiting: copy it at once
            if finishing_since is None:
                if recorder.finish_requested():
                    finishing_since = time.monotonic()
                    continue
                _sleep(recorder.control_fd, RECORDER_INTERVAL)
                continue
            if caught_up and ring.pending() == 0:
                break
            if time.monotonic() - finishing_since > self.final_drain_seconds:
                break  # a record stayed reserved and never committed
            time.sleep(0.001)

    # -- the decoder's side (parent) ------------------------------------------------------

    def read(self, limit: int) -> bytes:
        """Spooled bytes from `position`, at most `limit`."""
        assert self._recorder is not None and self._data is not None
        self._read_log()
        written = self._recorder.published(_WRITTEN)
        backlog = written - self.position
        self.peak_backlog = max(self.peak_backlog, backlog)
        self.more = backlog > limit
        if backlog <= 0:
            return b""
        return self._data.read_at(min(backlog, limit), self.position)

    def advance(self, consumed: int, records: int) -> None:
        """The decoder walked `consumed` bytes (`records` records) from `position`."""
        assert self._data is not None
        self.position += consumed
        self.records_read += records
        while self._log and self._log[0][0] <= self.position:
            self.watermark = self._log.popleft()[1]
        if not self._log:
            self._read_log()
            while self._log and self._log[0][0] <= self.position:
                self.watermark = self._log.popleft()[1]
        if self.position - self._released >= RELEASE_EVERY:
            self._data.release(self.position)
            self._released = self.position

    def _read_log(self) -> None:
        """Entries of the order log not read yet (a block at a time; the entries whose byte
        count the decoder has passed apply at once)."""
        assert self._recorder is not None and self._order is not None
        if len(self._log) >= _LOG_BLOCK:
            return
        available = self._recorder.published(_ENTRIES) - self._log_read
        count = min(available, _LOG_BLOCK)
        if count <= 0:
            return
        raw = self._order.read_at(count * _LOG.size, self._log_read * _LOG.size)
        self._log_read += len(raw) // _LOG.size
        for written, watermark in _LOG.iter_unpack(raw[: len(raw) // _LOG.size * _LOG.size]):
            if written <= self.position:
                self.watermark = watermark
            else:
                self._log.append((written, watermark))
        if self._log_read % _LOG_BLOCK == 0:
            self._order.release(self._log_read * _LOG.size)

    def wait(self, timeout: float | None = None) -> None:
        """Until the recorder spooled something, a watched file is readable, or `timeout`."""
        if self._recorder is not None:
            self._recorder.wait(timeout)

    def watch(self, fd: int, on: bool = True) -> None:
        if self._recorder is not None:
            self._recorder.watch(fd, on)

    def finish(self) -> None:
        if self._recorder is not None:
            self._recorder.finish()

    @property
    def finished(self) -> bool:
        if self._recorder is None:
            return True
        return self._recorder.done and self.backlog_bytes == 0

    @property
    def backlog_bytes(self) -> int:
        if self._recorder is None:
            return 0
        return self._recorder.published(_WRITTEN) - self.position

    @property
    def backlog_records(self) -> int:
        """Records spooled and not walked by the decoder yet."""
        if self._recorder is None:
            return 0
        return self._recorder.published(_RECORDS) - self.records_read

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
        for spool in (self._data, self._order):
            if spool is not None:
                spool.close()


def _sleep(fd: int, seconds: float) -> None:
    """Sleep `seconds` unless `fd` (the recorder's control pipe) becomes readable."""
    try:
        select.select([fd], [], [], seconds)
    except InterruptedError:
        pass
