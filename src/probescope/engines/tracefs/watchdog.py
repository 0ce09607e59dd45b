"""A detached process that removes a session's tracefs objects within about a second when the
session dies without tearing down (SIGKILL, the OOM killer), and otherwise ends with it.

Without it, the uprobes of a killed session keep firing into its orphan instance — a trap per
hit in every process that maps the probed file — until some later run reaps them. The watchdog
is forked (twice, in a session of its own, so the terminal's Ctrl-C and hang-up do not reach
it) before the session creates anything; it holds a pidfd of the session and a pipe from it:

- the session says `done` on the pipe once its own teardown ran: the watchdog exits;
- the pidfd becomes readable (the session died) without that word: the watchdog removes the
  instance and the event group named after the session — those names and no others (the
  pidfd is that very process: a pid reused since cannot fool it) — then exits.

It closes every other file (a shell pipeline's end, the command's start gate), protects itself
from the OOM killer where it may, and names itself `probescope-wd`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from probescope.engines.launch import name_this_process
from probescope.engines.tracefs.reaper import Leftovers, leftovers_named, reap
from probescope.engines.tracefs.tracefs import Tracefs

NAME = "probescope-wd"
_DONE = b"done"


@dataclass
class Watchdog:
    """The session's side: the watchdog's pid and the pipe to stand it down."""

    pid: int
    _pipe: int

    @classmethod
    def start(cls, tracefs: Tracefs, instance: str, group: str) -> Watchdog:
        """Fork the watchdog for this process's objects `instance` and `group`. Returns once
        the watchdog runs and watches."""
        session_fd = os.pidfd_open(os.getpid())
        words_r, words_w = os.pipe2(os.O_CLOEXEC)
        pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            middle = os.fork()
            if middle == 0:  # the middle process: a new session, the watchdog, then leave
                status = 1
                try:
                    os.setsid()
                    if os.fork() == 0:
                        _watch(tracefs, instance, group, session_fd, words_r, pid_w)
                        status = 0
                    else:
                        status = 0
                except BaseException:  # never unwind into the session's code in a child
                    pass
                finally:
                    os._exit(status)
            os.close(pid_w)
            pid_w = -1
            _wait_for(middle)
            data = _read_all(pid_r)
        finally:
            for fd in (session_fd, words_r, pid_r, pid_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        if not data.isdigit():
            os.close(words_w)
            raise OSError("the tracefs watchdog did not start")
        return cls(int(data), words_w)

    def stand_down(self) -> None:
        """The session removed its objects itself: the watchdog exits. Idempotent."""
        if self._pipe < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._pipe, _DONE)
        with contextlib.suppress(OSError):
            os.close(self._pipe)
        self._pipe = -1


def _watch(
    tracefs: Tracefs,
    instance: str,
    group: str,
    session_fd: int,
    words: int,
    pid_pipe: int,
) -> None:
    """The watchdog's life (in the forked process; never returns into the session's code)."""
    _close_other_files({session_fd, words, pid_pipe})
    _quiet_standard_files()
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _name_and_shield()
    os.write(pid_pipe, str(os.getpid()).encode())
    os.close(pid_pipe)
    poller = select.poll()
    poller.register(session_fd, select.POLLIN)
    poller.register(words, select.POLLIN)
    said = b""
    while True:
        with contextlib.suppress(InterruptedError):
            ready = dict(poller.poll())
        if words in ready:
            with contextlib.suppress(OSError):
                said += os.read(words, 16)
            if said.startswith(_DONE):
                return
            poller.unregister(words)  # end of file: the session is gone; its pidfd says so too
        if session_fd in ready:
            break
    if said.startswith(_DONE):
        return
    # The pidfd is this very process (no pid reuse can fool it), dead even as a zombie.
    leftovers: Leftovers = leftovers_named(tracefs, instance, group)
    if leftovers:
        reap(tracefs, leftovers)


def _close_other_files(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _quiet_standard_files() -> None:
    """Let go of the terminal and of pipes (a reader waiting for the end of probescope's output
    must not wait for the watchdog)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _name_and_shield() -> None:
    name_this_process(NAME)
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("-1000")


def _wait_for(pid: int) -> None:
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def _read_all(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 32)
        except InterruptedError:
            continue
        if not chunk:
            return data
        data += chunk
