"""Keep the kernel's ring buffer empty while the decoder works behind: a recorder process copies
sub-buffers out of `trace_pipe_raw` into spool files as fast as the kernel fills them.

Decoding and printing cost far more per event than copying a sub-buffer. When one process did
both, a burst the decoder could not follow overwrote the ring buffer and events were lost that
`trace-cmd record` (which only copies) keeps. So the copying runs in a forked child that does
nothing else, like trace-cmd's recorders, and the session decodes from the spool: the ring
buffer only has to absorb the recorder's scheduling delays, the spool absorbs the decoder's.

The spool is an unlinked temporary file of sub-buffers in the order the recorder read them
(nothing is left on disk whatever ends the session), the space the decoder has consumed
released with FALLOC_FL_PUNCH_HOLE as it goes, so it holds only the backlog. Beside it an order
log says, entry by entry, which CPU each sub-buffer came from and when the recorder caught up
with the writer on a CPU: what a time-ordered merge across CPUs needs to know that no earlier
event can still come (see `decoder.LiveMerge`). The recorder publishes the log's length in a
shared counter after writing, so the decoder never reads a half-written entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import select
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from probescope.engines.launch import die_with_parent, name_this_process
from probescope.engines.tracefs.live_reader import LiveReader
from probescope.errors import ProbescopeError

FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2
RELEASE_EVERY = 256  # sub-buffers consumed between two hole punches
_COUNTER = struct.Struct("=Q")
_ENTRY = struct.Struct("=HH")  # CPU index, SUB_BUFFER or CAUGHT_UP
SUB_BUFFER, CAUGHT_UP = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)


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
    ) -> None:
        self.subbuffer_size = subbuffer_size
        self.interval = interval
        self.coalesce_seconds = coalesce_seconds
        self.ring_empty = ring_empty
        self.final_drain_seconds = final_drain_seconds
        self.cpus = list(paths)
        self.pages_read = 0
        self.more = False
        self.recorder_pid: int | None = None
        self.recorder_status: int | None = None
        self._entries_read = 0
        self._released = 0
        # Log entries written, then the recorder's "done" flag.
        self._counters = mmap.mmap(-1, 2 * _COUNTER.size)
        self._data = self._log = -1
        self._control_r = self._control_w = self._notify_r = self._notify_w = -1
        self._kernel = LiveReader(paths, subbuffer_size, interval, is_partial)
        try:
            self._data = _unlinked_file()
            self._log = _unlinked_file()
            self._control_r, self._control_w = os.pipe()
            self._notify_r, self._notify_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.close()
            raise
        self._poller = select.poll()
        self._poller.register(self._notify_r, select.POLLIN)
        for fd in wake_fds:
            self._poller.register(fd, select.POLLIN)

    # -- the recorder (child) -------------------------------------------------------------

    def start(self) -> None:
        """Fork the recorder; from here on the kernel's buffers are read by it alone."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                self._record()
                status = 0
            except BrokenPipeError:  # the session is gone (killed): nobody to record for
                status = 0
            except BaseException:  # the child must never unwind into the parent's code
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                os._exit(status)
        self.recorder_pid = pid
        os.close(self._control_r)
        os.close(self._notify_w)
        self._control_r = self._notify_w = -1
        self._kernel.close()

    def _record(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        die_with_parent(signal.SIGKILL)
        name_this_process("probescope-rec")
        if os.getppid() == 1:
            return
        kernel, size = self._kernel, self.subbuffer_size
        _close_fds_except(
            {0, 1, 2, self._control_r, self._notify_w, self._data, self._log}
            | set(kernel.fds.values())
        )
        index = {cpu: number for number, cpu in enumerate(self.cpus)}
        pages = entries = 0
        kernel.poller.register(self._control_r, select.POLLIN)
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
                _write_all(self._data, b"".join(chunk), pages * size)
                pages += len(chunk)
            if log:
                _write_all(self._log, bytes(log), entries * _ENTRY.size)
                entries += len(log) // _ENTRY.size
                _COUNTER.pack_into(self._counters, 0, entries)
                with contextlib.suppress(BlockingIOError):
                    os.write(self._notify_w, b"\1")
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
                kernel.wait(None)  # until the kernel has an event for us, or we are told
            if _readable(self._control_r):
                with contextlib.suppress(OSError):
                    os.read(self._control_r, 16)
                finishing_since = time.monotonic()
        _COUNTER.pack_into(self._counters, _COUNTER.size, 1)
        with contextlib.suppress(BlockingIOError):
            os.write(self._notify_w, b"\1")

    # -- the decoder's side (parent) ------------------------------------------------------

    def _entries_written(self) -> int:
        return int(_COUNTER.unpack_from(self._counters, 0)[0])

    def drain(self, limit: int = 64) -> Iterator[tuple[int, bytes | None]]:
        """What the recorder has logged and the decoder has not read, at most `limit`
        sub-buffers per CPU's worth of entries; `more` is set when there was more."""
        size, cpus = self.subbuffer_size, self.cpus
        available = self._entries_written() - self._entries_read
        budget = limit * len(cpus)
        self.more = available > budget
        if not available:
            return
        count = min(available, budget)
        log = os.pread(self._log, count * _ENTRY.size, self._entries_read * _ENTRY.size)
        entries = list(_ENTRY.iter_unpack(log))
        pages = sum(1 for _, kind in entries if kind == SUB_BUFFER)
        data = os.pread(self._data, pages * size, self.pages_read * size) if pages else b""
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
            self._release()

    def _release(self) -> None:
        size = self.subbuffer_size
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        start, length = self._released * size, (self.pages_read - self._released) * size
        _libc.fallocate(self._data, mode, ctypes.c_long(start), ctypes.c_long(length))
        self._released = self.pages_read

    def wait(self, timeout: float | None = None) -> None:
        """Sleep until the recorder spooled something, one of the `wake_fds` is readable (a
        traced process's pidfd: it ended), or `timeout` (default: interval) — a timer that
        touches no file, so the consumer can stop on time."""
        timeout = self.interval if timeout is None else timeout
        with contextlib.suppress(InterruptedError):
            ready = self._poller.poll(int(timeout * 1000))
            if any(fd == self._notify_r for fd, _ in ready):
                with contextlib.suppress(BlockingIOError):
                    os.read(self._notify_r, 4096)
        self._check_recorder()

    def forget(self, fd: int) -> None:
        """Stop waking on `fd` (one of the `wake_fds`), before it is closed."""
        with contextlib.suppress(KeyError):
            self._poller.unregister(fd)

    def _check_recorder(self) -> None:
        if self.recorder_pid is None or self.recorder_status is not None:
            return
        pid, status = os.waitpid(self.recorder_pid, os.WNOHANG)
        if pid == 0:
            return
        self.recorder_status = os.waitstatus_to_exitcode(status)
        if self.recorder_status != 0:
            raise ProbescopeError(
                f"the ring-buffer recorder (pid {pid}) died with status {self.recorder_status}",
                hint="its error is printed above; events after this point were not recorded",
            )

    def finish(self) -> None:
        """Ask the recorder to empty the ring buffer into the spool and exit."""
        if self._control_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._control_w, b"q")

    def _recorder_done(self) -> bool:
        return bool(_COUNTER.unpack_from(self._counters, _COUNTER.size)[0] == 1)

    @property
    def finished(self) -> bool:
        done = self._recorder_done()
        if not done:
            self._check_recorder()
            done = self.recorder_status is not None
        return done and self.backlog == 0

    @property
    def backlog(self) -> int:
        """Log entries (sub-buffers and catch-up marks) spooled and not yet read."""
        return self._entries_written() - self._entries_read

    def close(self) -> None:
        """Stop the recorder (it holds the instance's trace_pipe_raw files open, which keeps
        the instance from being removed) and drop the spool."""
        if self.recorder_pid is not None and self.recorder_status is None:
            if not self._recorder_done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.recorder_pid, signal.SIGKILL)
            while True:
                try:
                    _, status = os.waitpid(self.recorder_pid, 0)
                except InterruptedError:
                    continue
                except ChildProcessError:
                    status = 0
                self.recorder_status = os.waitstatus_to_exitcode(status)
                break
        self._kernel.close()
        for fd in (
            self._data,
            self._log,
            self._control_r,
            self._control_w,
            self._notify_r,
            self._notify_w,
        ):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._data = self._log = -1
        self._control_r = self._control_w = self._notify_r = self._notify_w = -1


def _unlinked_file() -> int:
    with tempfile.TemporaryFile(prefix="probescope-spool-") as spool:
        return os.dup(spool.fileno())


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        try:
            done = os.pwrite(fd, view, offset)
        except InterruptedError:
            continue
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise ProbescopeError(
                    f"no space left for the ring-buffer spool in {tempfile.gettempdir()}",
                    hint="point TMPDIR at a file system with room for the decoder's backlog",
                ) from error
            raise
        view = view[done:]
        offset += done


def _close_fds_except(keep: set[int]) -> None:
    """The recorder must not hold the session's other files: a command's start gate, an
    output file, pipes whose end-of-file someone waits for."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _readable(fd: int) -> bool:
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)
