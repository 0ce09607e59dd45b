"""Following one thread through an exec it announced (the exec handshake).

The stub in libc's `execve`/`execveat`/`fexecve` asked the tracer; the tracer holds the process
stopped (with PTRACE_O_TRACEEXEC), lets the asking thread run on under PTRACE_SYSCALL and every
other thread under PTRACE_CONT, and waits: an exec event stop means the new image is there and
nothing of it ran yet (the caller sets it up, holding that stop); the exit of a failed execve, or
the thread's end, lets everything go. Signals met meanwhile are handed on.
"""

from __future__ import annotations

import os
import signal
import time

from probescope.engines.fentry.world import StoppedProcess
from probescope.engines.ptrace import syscalls
from probescope.errors import PtraceError

PTRACE_SYSCALL = 0x18
WAIT_SECONDS = 10.0
_SYSCALL_STOP = 0x80 | signal.SIGTRAP  # PTRACE_O_TRACESYSGOOD
_EXEC_CALLS = (59, 322)  # execve, execveat
_ESRCH = 3
_JOB_STOPS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def follow(world: StoppedProcess, tid: int) -> int | bool | None:
    """The exec stop's wait status once thread `tid` exec'd (the process still held, with that
    thread only); False when it did not (execve failed, the thread ended: all released); None
    when nothing happened in time (all released)."""
    requester = world.threads.get(tid)
    if requester is None:
        world.release()
        return False
    try:
        for thread in world.threads.values():
            if thread is requester:
                syscalls.ptrace(PTRACE_SYSCALL, thread.tid, 0, thread.pending_signal)
            elif thread.group_stop:
                syscalls.listen(thread.tid)
            else:
                syscalls.cont(thread.tid, thread.pending_signal)
            thread.pending_signal = 0
            thread.running = True
    except PtraceError:
        world.release()
        raise
    return _await(world, tid)


def _await(world: StoppedProcess, tid: int) -> int | bool | None:
    deadline = time.monotonic() + WAIT_SECONDS
    in_exec_call = False
    while time.monotonic() < deadline:
        got = _wait_any(world)
        if got is None:
            time.sleep(0.0005)
            continue
        who, status = got
        thread = world.threads.get(who)
        if not syscalls.stopped(status):
            world.threads.pop(who, None)
            if who == tid or not world.threads:
                world.release()
                return False
            continue
        if thread is None:
            continue
        event = syscalls.stop_event(status)
        sig = syscalls.stop_signal(status)
        if event == syscalls.PTRACE_EVENT_EXEC:
            # only the exec'ing thread is left, now with tid == tgid
            world.threads = {world.pid: thread}
            return status
        if who == tid and status >> 8 == _SYSCALL_STOP:
            thread.regset.fetch(who)
            if int(thread.regs.orig_rax) in _EXEC_CALLS:
                if in_exec_call:  # the exit of a failed execve
                    world.release()
                    return False
                in_exec_call = True
            syscalls.ptrace(PTRACE_SYSCALL, who, 0, 0)
            continue
        resume_signal = sig if event == 0 and sig != signal.SIGTRAP else 0
        try:
            if event == syscalls.PTRACE_EVENT_STOP and sig in _JOB_STOPS:
                syscalls.listen(who)
            elif who == tid:
                syscalls.ptrace(PTRACE_SYSCALL, who, 0, resume_signal)
            else:
                syscalls.cont(who, resume_signal)
        except PtraceError as error:
            if syscalls.ptrace_errno(error) != _ESRCH:
                raise
    _stop_and_release(world)
    return None


def _wait_any(world: StoppedProcess) -> tuple[int, int] | None:
    for tid in list(world.threads):
        try:
            got, status = os.waitpid(tid, os.WNOHANG | syscalls.WALL)
        except ChildProcessError:
            world.threads.pop(tid, None)
            continue
        if got:
            return got, status
    if not world.threads:
        return (world.pid, 0)
    return None


def _stop_and_release(world: StoppedProcess) -> None:
    for thread in world.threads.values():
        try:
            syscalls.interrupt(thread.tid)
        except PtraceError:
            pass
    deadline = time.monotonic() + 1.0
    pending = set(world.threads)
    while pending and time.monotonic() < deadline:
        got = _wait_any(world)
        if got is None:
            time.sleep(0.0005)
            continue
        pending.discard(got[0])
    world.release()
