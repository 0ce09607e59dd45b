"""Start a command so that the tracer holds it before its first instruction.

The child is forked and blocks reading a pipe; the tracer PTRACE_SEIZEs it there (no signal,
no group-stop involved), then releases it. The child execs and stops at PTRACE_EVENT_EXEC, where
the executable and ld.so are mapped but nothing of the program has run: the engine inserts its
breakpoints there. A failed exec is reported through a close-on-exec pipe as an errno.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from probescope.errors import PtraceError

# Python ignores these; a program started by a shell would have them at their defaults.
_RESET_SIGNALS = ("SIGPIPE", "SIGXFSZ")
# Looked up before any fork: the child must not take the dynamic linker's locks.
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_PR_SET_PDEATHSIG = 1


@dataclass
class HeldChild:
    pid: int
    _release_fd: int
    _error_fd: int

    def release(self) -> None:
        os.write(self._release_fd, b"x")
        os.close(self._release_fd)

    def exec_error(self) -> str | None:
        """The child's exec failure, once it has exited (None when exec succeeded)."""
        try:
            data = os.read(self._error_fd, 256)
        finally:
            os.close(self._error_fd)
        if not data:
            return None
        number, _, name = data.decode(errors="replace").partition(":")
        try:
            return f"{name}: {os.strerror(int(number))}"
        except ValueError:
            return data.decode(errors="replace")

    def close(self) -> None:
        for fd in (self._release_fd, self._error_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def fork_held(argv: Sequence[str], *, die_with_tracer: bool = False) -> HeldChild:
    """Fork a child that will exec `argv` once released. `die_with_tracer`: the command gets
    SIGTERM if this thread ends without letting it go (PR_SET_PDEATHSIG), as commands started
    by any engine do; it never runs if the tracer dies before releasing it."""
    if not argv:
        raise PtraceError("empty command")
    release_r, release_w = os.pipe2(os.O_CLOEXEC)
    error_r, error_w = os.pipe2(os.O_CLOEXEC)
    program = argv[0]
    args = list(argv)
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe work until exec
        try:
            os.close(release_w)
            os.close(error_r)
            for name in _RESET_SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    signal.signal(number, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            if die_with_tracer:
                _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.read(release_r, 1) != b"x":
                os._exit(127)  # the tracer went away before releasing us
            os.execvp(program, args)
        except OSError as error:
            try:
                os.write(error_w, f"{error.errno}:{program}".encode())
            except OSError:
                pass
        finally:
            os._exit(127)
    os.close(release_r)
    os.close(error_w)
    return HeldChild(pid, release_w, error_r)
