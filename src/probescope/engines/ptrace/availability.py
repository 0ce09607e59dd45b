"""Can the ptrace engine run here? Checked by asking the kernel, not by guessing.

The decisive test attaches to a throw-away child with PTRACE_SEIZE, interrupts it and lets it
go: that catches seccomp filters (containers), Yama, LSMs and missing syscalls alike, and the
error the kernel returns is what the reason quotes.
"""

from __future__ import annotations

import os
import platform
import signal

from probescope.engines.base import Availability
from probescope.engines.ptrace import syscalls
from probescope.errors import PtraceError
from probescope.system import procfs

SUPPORTED_MACHINES = ("x86_64",)


def check() -> Availability:
    machine = platform.machine()
    if machine not in SUPPORTED_MACHINES:
        return Availability(
            False,
            f"the ptrace engine supports x86_64 only; this machine is {machine}",
            hint="use the tracefs engine (root) on this architecture",
        )
    if platform.system() != "Linux":
        return Availability(False, "the ptrace engine needs Linux")
    scope = procfs.ptrace_scope()
    if scope == 3:
        return Availability(
            False,
            "kernel.yama.ptrace_scope=3: ptrace is disabled on this machine until reboot",
        )
    if scope == 2 and os.geteuid() != 0:
        return Availability(
            False,
            "kernel.yama.ptrace_scope=2: only root (CAP_SYS_PTRACE) may use ptrace",
            hint="run as root, or set kernel.yama.ptrace_scope to 0 or 1",
        )
    failure = _try_seize()
    if failure is not None:
        return Availability(False, failure, hint=_hint_for(failure))
    if not _process_vm_readv_works():
        return Availability(False, "process_vm_readv is not permitted here (seccomp?)")
    note = ""
    if scope == 1:
        note = (
            "kernel.yama.ptrace_scope=1: only programs started by probescope (-c) can be "
            "traced without CAP_SYS_PTRACE"
        )
    return Availability(True, note)


def _try_seize() -> str | None:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write_fd)
            os.read(read_fd, 1)
        finally:
            os._exit(0)
    os.close(read_fd)
    try:
        try:
            syscalls.seize(pid, 0)
        except PtraceError as error:
            return f"PTRACE_SEIZE is refused: {error.message}"
        try:
            syscalls.interrupt(pid)
            os.waitpid(pid, syscalls.WALL)
            syscalls.detach(pid)
        except (PtraceError, ChildProcessError) as error:
            return f"ptrace does not work here: {error}"
        return None
    finally:
        os.close(write_fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _process_vm_readv_works() -> bool:
    reader = syscalls.RemoteReader(64)
    probe = b"probescope"
    import ctypes

    buffer = ctypes.create_string_buffer(probe)
    return reader.read(os.getpid(), ctypes.addressof(buffer), len(probe)) == probe


def _hint_for(failure: str) -> str | None:
    if "EPERM" in failure:
        return (
            "a seccomp filter or security module forbids ptrace here (containers: "
            "--cap-add SYS_PTRACE or a seccomp profile allowing ptrace)"
        )
    if "ENOSYS" in failure:
        return "this kernel was built without ptrace support"
    return None
