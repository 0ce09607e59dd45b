"""The bpf engine's event stream: records from the recorder's spool (ring_spool.py) decoded
into Events and released in exact time order, until the target ends and the spool is read out.
"""

from __future__ import annotations

import bisect
import operator
import os
import time
from collections.abc import Callable, Iterator

from probescope.engines.base import EngineStats
from probescope.engines.bpf.decode import RecordDecoder
from probescope.engines.bpf.ring_spool import RingSpool
from probescope.engines.bpf.ringbuf import RingBuffer
from probescope.events import Event, EventBatch

BATCH_BYTES = 1 << 20
"""The most of the spool decoded into one batch: bounds the memory a backlog takes in Python."""
LAG_NOTE_SECONDS = 1.0
"""A decoder that finished this long after the target ended says so in the summary."""
_TIMESTAMP = operator.itemgetter(0)


class EventStream:
    """`events()` yields EventBatches: events in timestamp order across CPUs (each released
    once the recorder's watermark has passed it), the records lost since the last batch, and
    an empty batch at least every `interval` seconds. `target_ended()` is asked between
    batches; once true, `on_target_end()` runs and the stream ends when the ring and the
    spool are empty."""

    def __init__(
        self,
        ring: RingBuffer,
        decoder: RecordDecoder,
        *,
        clock: str,
        interval: float,
        losses: Callable[[], int],
        target_ended: Callable[[], bool],
        on_target_end: Callable[[], None],
    ) -> None:
        self.spool = RingSpool(ring, clock, interval)
        self.decoder = decoder
        self.interval = interval
        self.losses = losses
        self.target_ended = target_ended
        self.on_target_end = on_target_end
        self.held: list[Event] = []  # decoded, younger than the watermark
        self.ended_at: float | None = None  # when the target ended (monotonic)
        self.drained_at: float | None = None  # when the last event was released
        self.backlog_at_end = 0  # spool bytes ahead of the decoder when the target ended
        self._pidfds: list[int] = []

    def start(self) -> None:
        self.spool.start()

    def watch_target(self, pids: tuple[int, ...]) -> None:
        """Wake up as soon as one of `pids` ends (a pidfd each), not an interval later."""
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # already gone, or not ours to watch: asked every interval anyway
            self._pidfds.append(fd)
            self.spool.watch(fd)

    def _unwatch_target(self) -> None:
        for fd in self._pidfds:
            self.spool.watch(fd, False)
            os.close(fd)
        self._pidfds.clear()

    def events(self) -> Iterator[EventBatch]:
        spool, decoder, held = self.spool, self.decoder, self.held
        ending = False
        last_yield = last_check = time.monotonic()
        while True:
            data = spool.read(BATCH_BYTES)
            if data:
                walked = decoder.walk(data)
                spool.advance(walked.consumed, len(walked.events) + walked.discarded)
                held += walked.events  # the one list, sorted and cut in place
            lost = self.losses()
            done = ending and spool.finished
            released = self._release(flush=done)
            if released or lost:
                last_yield = time.monotonic()
                yield EventBatch(released, lost)
            if done:
                self.drained_at = time.monotonic()
                return
            now = time.monotonic()
            if not ending and (not spool.more or now - last_check >= self.interval):
                last_check = now
                if self.target_ended():  # asked while behind too: the recorder ends sooner
                    self.ended_at = now
                    self.backlog_at_end = spool.backlog_bytes
                    self._unwatch_target()
                    self.on_target_end()
                    spool.finish()
                    ending = True
            if spool.more:
                continue
            if ending:
                spool.wait(0.005)
                continue
            if now - last_yield >= self.interval:
                last_yield = now
                yield EventBatch([])
            spool.wait()

    def _release(self, *, flush: bool) -> list[Event]:
        """The held events the watermark has passed (all of them with `flush`), in time
        order; the younger ones stay held."""
        held = self.held
        if not held:
            return []
        held.sort(key=_TIMESTAMP)  # nearly sorted already: a linear pass
        if flush:
            cut = len(held)
        else:
            cut = bisect.bisect_right(held, self.spool.watermark, key=_TIMESTAMP)
        released = held[:cut]
        del held[:cut]
        return released

    def close(self, stats: EngineStats) -> None:
        """Stop the recorder, and note in `stats` what was recorded and not delivered (the
        session ended before the decoder caught up: -d, -n, Ctrl-C) and how far the decoder
        lagged behind the target's end."""
        self._unwatch_target()
        self.spool.close()
        ring = self.spool.ring
        _, in_ring = ring.committed(ring.consumer_pos, ring.producer_pos, ring.size)
        undelivered = self.spool.backlog_records + len(self.held) + in_ring
        stats.extra.update(spool_peak_bytes=self.spool.peak_backlog, undelivered=undelivered)
        if undelivered:
            stats.notes.append(
                f"{undelivered} records recorded but not decoded: the session ended before "
                "the decoder caught up with the recorder"
            )
        if self.ended_at is not None and self.drained_at is not None:
            lag = self.drained_at - self.ended_at
            stats.extra["decode_lag_ms"] = round(lag * 1000)
            if lag >= LAG_NOTE_SECONDS:
                stats.notes.append(
                    f"the decoder finished {lag:.1f} s after the target ended "
                    f"({self.backlog_at_end / 1e6:.0f} MB were spooled ahead of it then)"
                )
