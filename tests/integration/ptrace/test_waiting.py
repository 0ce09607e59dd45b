"""The tracer's wait: interrupted by its own timer every period, silent once closed."""

from __future__ import annotations

import os
import time

from probescope.engines.ptrace import syscalls
from probescope.engines.ptrace.waiting import InterruptibleWait


def test_ticks_then_the_child_then_silence():
    pid = os.fork()
    if pid == 0:
        time.sleep(0.35)
        os._exit(7)
    waiter = InterruptibleWait(syscalls.WALL, 0.1)
    started = time.monotonic()
    ticks = 0
    while (got := waiter.wait()) is None:
        ticks += 1
    assert got[0] == pid and syscalls.exit_code(got[1]) == 7
    assert 2 <= ticks <= 4
    assert 0.3 < time.monotonic() - started < 1.0
    waiter.close()
    waiter.close()
    # No timer left: a blocking call in this thread is no longer interrupted.
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        time.sleep(0.3)
        os.write(write_fd, b"x")
        os._exit(0)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(1)
    assert libc.read(read_fd, buffer, 1) == 1  # a raw read: EINTR would return -1
    os.waitpid(pid, 0)
    os.close(read_fd)
    os.close(write_fd)
