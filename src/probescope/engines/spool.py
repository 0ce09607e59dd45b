"""A recorder process that copies what the kernel writes into an unlinked spool file as fast as
the kernel writes it, so the decoder (the session's own process) can work behind it: what both
the tracefs engine (sub-buffers of `trace_pipe_raw`) and the bpf engine (its BPF ring buffer)
stream through.

Decoding and printing cost far more per event than copying bytes. When one process did both,
a burst the decoder could not follow filled the kernel's buffer and events were lost that a
plain copier (`trace-cmd record`) keeps. So the copying runs in a forked child that does
nothing else, and the session decodes from the spool: the kernel's buffer only has to absorb
the recorder's scheduling delays, the spool absorbs the decoder's.

`Recorder` is the child and both sides of its handshake: counters in a shared anonymous
mapping that the child publishes (each one a single aligned 8-byte store, read with a single
load — never torn), a pipe that tells the decoder something was published, a pipe that asks
the child to finish, and a flag it sets once it has. The child dies with the session
(PR_SET_PDEATHSIG) and holds none of the session's other files. `SpoolFile` is an unlinked
temporary file (nothing is left on disk whatever ends the session) whose space the decoder
gives back with FALLOC_FL_PUNCH_HOLE as it consumes it, so it holds only the backlog.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import select
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable

from probescope.engines.launch import die_with_parent, name_this_process
from probescope.errors import ProbescopeError

FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2
_libc = ctypes.CDLL(None, use_errno=True)


class SpoolFile:
    """An unlinked file the recorder writes at increasing offsets and the decoder reads
    behind it; `release(upto)` punches out everything before `upto`."""

    def __init__(self) -> None:
        with tempfile.TemporaryFile(prefix="probescope-spool-") as spool:
            self.fd = os.dup(spool.fileno())
        self._released = 0

    def write_at(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            try:
                done = os.pwrite(self.fd, view, offset)
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

    def read_at(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def release(self, upto: int) -> None:
        """Give the file system back the bytes before `upto` (the decoder consumed them)."""
        if upto <= self._released:
            return
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        _libc.fallocate(
            self.fd, mode, ctypes.c_long(self._released), ctypes.c_long(upto - self._released)
        )
        self._released = upto

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class Recorder:
    """A forked child running `body()` and what the two processes share.

    In the child: `publish(i, value)` stores counter `i` and `notify()` wakes the decoder;
    `control_fd` becomes readable (and `finish_requested()` true) once the decoder called
    `finish()`. In the parent: `published(i)`, `wait()`, `done`, `check()`, `close()`."""

    def __init__(
        self, counters: int, interval: float = 0.1, *, name: str = "probescope-rec"
    ) -> None:
        self.interval = interval
        self.name = name  # the child's comm, as `ps` and trace records show it
        self.pid: int | None = None
        self.status: int | None = None
        self._count = counters
        # the counters, then the child's "done" flag
        self._shared = mmap.mmap(-1, 8 * (counters + 1))
        self._words = memoryview(self._shared).cast("Q")
        self._control_r = self._control_w = self._notify_r = self._notify_w = -1
        try:
            self._control_r, self._control_w = os.pipe()
            self._notify_r, self._notify_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.close()
            raise
        self._poller = select.poll()
        self._poller.register(self._notify_r, select.POLLIN)

    # -- the child ------------------------------------------------------------------------

    def start(self, body: Callable[[], None], keep_fds: Iterable[int]) -> None:
        """Fork; the child closes every file but `keep_fds` and the handshake's, runs `body`,
        marks itself done and exits. Returns in the parent only."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                die_with_parent(signal.SIGKILL)
                name_this_process(self.name)
                if os.getppid() != 1:
                    _close_fds_except({0, 1, 2, self._control_r, self._notify_w, *keep_fds})
                    body()
                    self._words[self._count] = 1
                    self.notify()
                status = 0
            except BrokenPipeError:  # the session is gone (killed): nobody to record for
                status = 0
            except BaseException:  # the child must never unwind into the parent's code
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                os._exit(status)
        self.pid = pid
        os.close(self._control_r)
        os.close(self._notify_w)
        self._control_r = self._notify_w = -1

    @property
    def control_fd(self) -> int:
        """Readable once the decoder asked the child to finish (for the child's poll)."""
        return self._control_r

    def finish_requested(self) -> bool:
        ready, _, _ = select.select([self._control_r], [], [], 0)
        if ready:
            with contextlib.suppress(OSError):
                os.read(self._control_r, 16)
        return bool(ready)

    def publish(self, index: int, value: int) -> None:
        self._words[index] = value

    def notify(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._notify_w, b"\1")

    # -- the parent -----------------------------------------------------------------------

    def published(self, index: int) -> int:
        return int(self._words[index])

    @property
    def done(self) -> bool:
        """The child has copied everything and exited (or is about to)."""
        if self._words[self._count] == 1:
            return True
        self.check()
        return self.status is not None

    def watch(self, fd: int, on: bool = True) -> None:
        """Let `fd` end `wait()` too when it becomes readable (a traced process's pidfd: it
        ended), or no more."""
        if on:
            self._poller.register(fd, select.POLLIN)
        else:
            with contextlib.suppress(KeyError):
                self._poller.unregister(fd)

    def wait(self, timeout: float | None = None) -> None:
        """Sleep until the child published something, a watched file is readable, or
        `timeout` (default: interval)."""
        timeout = self.interval if timeout is None else timeout
        with contextlib.suppress(InterruptedError):
            ready = self._poller.poll(int(timeout * 1000))
            if any(fd == self._notify_r for fd, _ in ready):
                with contextlib.suppress(BlockingIOError):
                    os.read(self._notify_r, 4096)
        self.check()

    def check(self) -> None:
        """Raise if the child died (its own error is printed above by it)."""
        if self.pid is None or self.status is not None:
            return
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return
        self.status = os.waitstatus_to_exitcode(status)
        if self.status != 0:
            raise ProbescopeError(
                f"the ring-buffer recorder (pid {pid}) died with status {self.status}",
                hint="its error is printed above; events after this point were not recorded",
            )

    def finish(self) -> None:
        """Ask the child to copy what remains and exit."""
        if self._control_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._control_w, b"q")

    def close(self) -> None:
        """Kill the child unless it is done, reap it, close the pipes."""
        if self.pid is not None and self.status is None:
            if self._words[self._count] != 1:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            while True:
                try:
                    _, status = os.waitpid(self.pid, 0)
                except InterruptedError:
                    continue
                except ChildProcessError:
                    status = 0
                self.status = os.waitstatus_to_exitcode(status)
                break
        for fd in (self._control_r, self._control_w, self._notify_r, self._notify_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._control_r = self._control_w = self._notify_r = self._notify_w = -1


def _close_fds_except(keep: set[int]) -> None:
    """The recorder must not hold the session's other files: a command's start gate, an
    output file, pipes whose end-of-file someone waits for."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
