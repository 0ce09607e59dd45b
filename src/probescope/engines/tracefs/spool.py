"""Keep the kernel's ring buffer empty while the decoder works behind: a recorder process
(`engines/spool.py`) copies sub-buffers out of `trace_pipe_raw` into a spool file as fast as
the kernel fills them, like trace-cmd's recorders.

The spool holds sub-buffers in the order the recorder read them. Beside it an order log says,
entry by entry, which CPU each sub-buffer came from and when the recorder caught up with the
writer on a CPU: what a time-ordered merge across CPUs needs to know that no earlier event can
still come (see `traceevent.merge.LiveMerge`). The recorder publishes the log's length after
writing, so the decoder never reads a half-written entry.
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from probescope.engines.spool import Recorder, SpoolFile
from probescope.engines.tracefs.live_reader import LiveReader
from probescope.errors import ProbescopeError

RELEASE_EVERY = 256  # sub-buffers consumed between two hole punches
_ENTRY = struct.Struct("=HH")  # CPU index, SUB_BUFFER or CAUGHT_UP
SUB_BUFFER, CAUGHT_UP = 0, 1
_ENTRIES = 0  # the recorder's published counter: log entries written


WAKING_KERNEL = (6, 6)
"""From this release on, poll on trace_pipe_raw wakes at the first event with buffer_percent 0
(measured on 6.18); Linux 6.1 was seen never to wake the recorder at all."""


def idle_wait_for(release: tuple[int, ...]) -> float | None:
    """How long the recorder sleeps with nothing to read: until the kernel wakes it (None), or,
    on kernels whose poll does not, a tenth of a second before it looks again."""
    return None if tuple(release[:2]) >= WAKING_KERNEL else 0.1


class PageSpool:
    """Sub-buffers from every CPU through a recorder process, in the recorder's read order.

    The recorder waits on the kernel (poll on `trace_pipe_raw`; the instance's buffer_percent
    at 0 wakes it at the first event) and reads again `coalesce_seconds` after each read.

    `drain()` gives `(cpu, sub_buffer)` and `(cpu, None)` (the recorder caught up with that
    CPU's writer); `wait()`, `more` and `pages_read` as for LiveReader. `finish()` asks the
    recorder to copy what remains in the ring buffer and exit; `finished` is then true once it
    has and the decoder has read the spool to its end."""

    def __init__(
        self,
        paths: dict[int, Path],
        subbuffer_size: int,
        interval: float = 0.1,
        is_partial: Callable[[bytes], bool] | None = None,
        ring_empty: Callable[[], bool] | None = None,
        final_drain_seconds: float = 2.0,
        coalesce_seconds: float = 0.005,
        wake_fds: Sequence[int] = (),
        idle_wait: float | None = None,
    ) -> None:
        self.subbuffer_size = subbuffer_size
        self.interval = interval
        self.coalesce_seconds = coalesce_seconds
        self.idle_wait = idle_wait
        self.ring_empty = ring_empty
        self.final_drain_seconds = final_drain_seconds
        self.cpus = list(paths)
        self.pages_read = 0
        self.more = False
        self._entries_read = 0
        self._released = 0
        self._data: SpoolFile | None = None
        self._log: SpoolFile | None = None
        self._recorder: Recorder | None = None
        self._kernel = LiveReader(paths, subbuffer_size, interval, is_partial)
        try:
            self._data = SpoolFile()
            self._log = SpoolFile()
            self._recorder = Recorder(counters=1, interval=interval, name="probescope-rec")
        except OSError:
            self.close()
            raise
        for fd in wake_fds:
            self._recorder.watch(fd)

    @property
    def recorder_pid(self) -> int | None:
        return self._recorder.pid if self._recorder is not None else None

    @property
    def recorder_status(self) -> int | None:
        return self._recorder.status if self._recorder is not None else None

    # -- the recorder (child) -------------------------------------------------------------

    def start(self) -> None:
        """Fork the recorder; from here on the kernel's buffers are read by it alone."""
        assert self._recorder is not None and self._data is not None and self._log is not None
        keep = {self._data.fd, self._log.fd, *self._kernel.fds.values()}
        self._recorder.start(self._record, keep)
        self._kernel.close()

    def _record(self) -> None:
        assert self._recorder is not None and self._data is not None and self._log is not None
        recorder, kernel, size = self._recorder, self._kernel, self.subbuffer_size
        index = {cpu: number for number, cpu in enumerate(self.cpus)}
        pages = entries = 0
        kernel.poller.register(recorder.control_fd, select.POLLIN)
        finishing_since: float | None = None
        while True:
            log = bytearray()
            chunk: list[bytes] = []
            for cpu, data in kernel.drain():
                if data is None:
                    log += _ENTRY.pack(index[cpu], CAUGHT_UP)
                    continue
                chunk.append(data if len(data) == size else data.ljust(size, b"\0"))
                log += _ENTRY.pack(index[cpu], SUB_BUFFER)
            if chunk:
                self._data.write_at(b"".join(chunk), pages * size)
                pages += len(chunk)
            if log:
                self._log.write_at(bytes(log), entries * _ENTRY.size)
                entries += len(log) // _ENTRY.size
                recorder.publish(_ENTRIES, entries)
                recorder.notify()
            if kernel.more:
                continue
            if finishing_since is not None:
                if not chunk and (
                    self.ring_empty is None
                    or self.ring_empty()
                    or time.monotonic() - finishing_since > self.final_drain_seconds
                ):
                    break
                kernel.wait(0.005)
                continue
            if chunk:
                # Look again after a moment: a trickle of events is then read a few at a
                # time, not one per wake-up, and the pass after the last read logs every CPU
                # caught up — which lets the merge release everything read, the newest too.
                time.sleep(self.coalesce_seconds)
            else:
                kernel.wait(self.idle_wait)  # until the kernel has an event for us, or told
            if recorder.finish_requested():
                finishing_since = time.monotonic()

    # -- the decoder's side (parent) ------------------------------------------------------

    def _entries_written(self) -> int:
        return self._recorder.published(_ENTRIES) if self._recorder is not None else 0

    def drain(self, limit: int = 64) -> Iterator[tuple[int, bytes | None]]:
        """What the recorder has logged and the decoder has not read, at most `limit`
        sub-buffers per CPU's worth of entries; `more` is set when there was more."""
        assert self._data is not None and self._log is not None
        size, cpus = self.subbuffer_size, self.cpus
        available = self._entries_written() - self._entries_read
        budget = limit * len(cpus)
        self.more = available > budget
        if not available:
            return
        count = min(available, budget)
        log = self._log.read_at(count * _ENTRY.size, self._entries_read * _ENTRY.size)
        entries = list(_ENTRY.iter_unpack(log))
        pages = sum(1 for _, kind in entries if kind == SUB_BUFFER)
        data = self._data.read_at(pages * size, self.pages_read * size) if pages else b""
        if len(log) != count * _ENTRY.size or len(data) != pages * size:
            raise ProbescopeError("the ring-buffer spool ended before what its log announced")
        self._entries_read += count
        offset = 0
        for cpu_index, kind in entries:
            if kind == SUB_BUFFER:
                yield cpus[cpu_index], data[offset : offset + size]
                offset += size
                self.pages_read += 1
            else:
                yield cpus[cpu_index], None
        if self.pages_read - self._released >= RELEASE_EVERY:
            self._data.release(self.pages_read * size)
            self._released = self.pages_read

    def wait(self, timeout: float | None = None) -> None:
        """Sleep until the recorder spooled something, one of the `wake_fds` is readable (a
        traced process's pidfd: it ended), or `timeout` (default: interval) — a timer that
        touches no file, so the consumer can stop on time."""
        if self._recorder is not None:
            self._recorder.wait(timeout)

    def forget(self, fd: int) -> None:
        """Stop waking on `fd` (one of the `wake_fds`), before it is closed."""
        if self._recorder is not None:
            self._recorder.watch(fd, on=False)

    def finish(self) -> None:
        """Ask the recorder to empty the ring buffer into the spool and exit."""
        if self._recorder is not None:
            self._recorder.finish()

    @property
    def finished(self) -> bool:
        return self._recorder is None or (self._recorder.done and self.backlog == 0)

    @property
    def backlog(self) -> int:
        """Log entries (sub-buffers and catch-up marks) spooled and not yet read."""
        return self._entries_written() - self._entries_read

    def close(self) -> None:
        """Stop the recorder (it holds the instance's trace_pipe_raw files open, which keeps
        the instance from being removed) and drop the spool."""
        if self._recorder is not None:
            self._recorder.close()
        self._kernel.close()
        for spool in (self._data, self._log):
            if spool is not None:
                spool.close()
