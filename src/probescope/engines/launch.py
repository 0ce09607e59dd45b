"""Start a command stopped before exec, so an engine can arm its probes on the new process
before the program runs a single instruction of its own."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence

from probescope.errors import ExecError, ProbescopeError

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """A child's life is the session's: if probescope is killed outright, the child gets
    `signum` instead of running on with nobody tracing it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def name_this_process(name: str) -> None:
    """Set the task's name (`comm`, at most 15 bytes): what `ps` and trace records show for a
    helper process forked from the session (`probescope-rec`, `probescope-wd`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def check_command(argv: Sequence[str]) -> None:
    """Refuse a command exec would refuse (not found, missing, a directory, not executable),
    before anything is armed: a session calls this before its engine touches the kernel."""
    if not argv:
        raise ProbescopeError("empty command")
    program = argv[0]
    if "/" not in program:
        if shutil.which(program) is None:
            raise ProbescopeError(
                f"command not found: {program!r}", hint="give a path, or check PATH"
            )
        return
    _check_runnable(program)


def _check_runnable(path: str) -> None:
    """What exec would refuse for a path, said before anything is forked or armed (exit 2
    touches nothing); what only exec can tell (a bad ELF, a missing interpreter) comes back
    from `release()`."""
    if not os.path.exists(path):
        raise ProbescopeError(f"cannot run {path!r}: {os.strerror(errno.ENOENT)}")
    if os.path.isdir(path):
        raise ProbescopeError(f"cannot run {path!r}: {os.strerror(errno.EISDIR)}")
    if not os.access(path, os.X_OK):
        raise ProbescopeError(
            f"cannot run {path!r}: {os.strerror(errno.EACCES)}", hint=f"chmod +x {path}"
        )


class GatedCommand:
    """fork(); the child waits on a pipe; `release()` lets it exec the command.

    Exec failures come back through a close-on-exec pipe, like subprocess does, so a missing
    program is a clear error rather than an exit status of 127.
    """

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        if not argv:
            raise ProbescopeError("empty command")
        self.argv = list(argv)
        self.env = env
        self.pid: int | None = None
        self.returncode: int | None = None
        self._gate_w: int | None = None
        self._error_r: int | None = None

    def start(self, on_spawn: Callable[[int], None] | None = None) -> int:
        """Fork the held child; `on_spawn(pid)` runs before anything else may (a child it
        fails on is aborted)."""
        program = self.argv[0]
        check_command(self.argv)
        gate_r, gate_w = os.pipe()
        error_r, error_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(gate_w)
                os.close(error_r)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                die_with_parent()
                if os.read(gate_r, 1) != b"g":
                    os._exit(126)
                os.close(gate_r)
                if self.env is None:
                    os.execvp(program, self.argv)
                else:
                    os.execvpe(program, self.argv, self.env)
            except OSError as error:
                os.write(error_w, str(error.errno or errno.ENOEXEC).encode())
            finally:
                os._exit(127)
        os.close(gate_r)
        os.close(error_w)
        self.pid = pid
        self._gate_w = gate_w
        self._error_r = error_r
        if on_spawn is not None:
            try:
                on_spawn(pid)
            except BaseException:
                self.abort()
                raise
        return pid

    def release(self) -> None:
        """Let the child exec; raise if exec failed."""
        assert self._gate_w is not None and self._error_r is not None
        os.write(self._gate_w, b"g")
        os.close(self._gate_w)
        self._gate_w = None
        data = os.read(self._error_r, 32)
        os.close(self._error_r)
        self._error_r = None
        if data:
            self.wait()
            code = int(data)
            raise ExecError(f"cannot run {self.argv[0]!r}: {os.strerror(code)}")

    def abort(self) -> None:
        """The engine failed before release: the child exits without running the command."""
        if self._gate_w is not None:
            os.close(self._gate_w)
            self._gate_w = None
        if self._error_r is not None:
            os.close(self._error_r)
            self._error_r = None
        if self.pid is not None and self.returncode is None:
            self.wait()

    def terminate(self, grace: float = 2.0) -> None:
        """End the command if it still runs: SIGTERM, then SIGKILL after `grace` seconds."""
        if self.pid is None or self.poll() is not None:
            return
        os.kill(self.pid, signal.SIGTERM)
        if self.wait(grace) is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()

    def exited(self) -> bool:
        """The command has ended, and is left unreaped so that its /proc entry can still be
        read (poll() reaps it)."""
        if self.returncode is not None:
            return True
        if self.pid is None:
            return False
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.pid, flags) is not None

    def poll(self) -> int | None:
        if self.returncode is None and self.pid is not None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if timeout is None:
                assert self.pid is not None
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.01)
        return self.returncode
