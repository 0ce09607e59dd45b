"""Read raw sub-buffers from every CPU of an instance as they fill, without blocking on one CPU.

Each CPU's `trace_pipe_raw` is opened O_NONBLOCK and drained with read(2) (one sub-buffer per
call, partial ones included); between rounds the reader sleeps in poll(2), which the kernel
ends once `buffer_percent` of a buffer is full — at 0 (what the tracefs engine sets in its
instance), as soon as any event is written — so an idle session waits on the kernel with no
timer at all.
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable, Iterator
from pathlib import Path


class LiveReader:
    def __init__(
        self,
        paths: dict[int, Path],
        subbuffer_size: int,
        interval: float = 0.1,
        is_partial: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.is_partial = is_partial
        self.subbuffer_size = subbuffer_size
        self.interval = interval
        self.fds: dict[int, int] = {}
        self.poller = select.poll()
        try:
            for cpu, path in paths.items():
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                self.fds[cpu] = fd
                self.poller.register(fd, select.POLLIN)
        except OSError:
            self.close()
            raise
        self.pages_read = 0
        self.more = False

    def drain(self, limit: int = 64) -> Iterator[tuple[int, bytes | None]]:
        """The sub-buffers readable right now, at most `limit` per CPU, CPU by CPU, each CPU's
        followed by `(cpu, None)` when the reader caught up with the writer there (nothing
        left, or a sub-buffer `is_partial` says is half empty: reading on would hand out a few
        records per read); `more` is then set when a CPU had more (read again before
        waiting). Bounding a round bounds memory: a large ring buffer is consumed in slices."""
        size = self.subbuffer_size
        self.more = False
        for cpu, fd in self.fds.items():
            caught_up = False
            for _ in range(limit):
                try:
                    data = os.read(fd, size)
                except BlockingIOError:
                    caught_up = True
                    break
                except InterruptedError:
                    break
                if not data:
                    caught_up = True
                    break
                self.pages_read += 1
                yield cpu, data
                if self.is_partial is not None and self.is_partial(data):
                    caught_up = True
                    break
            if caught_up:
                yield cpu, None
            else:
                self.more = True

    def wait(self, timeout: float | None) -> None:
        """Sleep until a buffer is `buffer_percent` full (or another registered file is
        readable), at most `timeout` seconds (None: as long as it takes)."""
        with contextlib.suppress(InterruptedError):
            self.poller.poll(None if timeout is None else int(timeout * 1000))

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
