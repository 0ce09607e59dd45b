"""What the fentry engine checks before it touches a process, and the machine-wide facts it
reports: each refusal says why, and the session falls back to another engine.

- seccomp (`Seccomp:` in /proc/PID/status): the engine injects mmap, memfd_create, ftruncate,
  close, munmap, and its stubs call gettid, getpid, nanosleep and kill — a filter may refuse
  them or kill the process, so a filtered process is refused;
- Go binaries (their goroutine stacks are too small for a stub's pushes, and move) and C
  libraries other than glibc (the stubs read the thread id from glibc's struct pthread);
- SELinux with `deny_execmem` (no executable anonymous mappings for the program);
- the x86 user shadow stack (CET): return hooks would fault, so return probes are disabled in
  that process, with the reason;
- `vm.memfd_noexec` (the ring's memfd is created with MFD_NOEXEC_SEAL, which every setting
  allows) and `proc_mem.force_override=never` (code writes then go through PTRACE_POKEDATA,
  slower but allowed to a tracer) are reported, not refused.
"""

from __future__ import annotations

import os

from probescope.engines.fentry.world import StoppedProcess
from probescope.errors import ProbescopeError
from probescope.system import procfs
from probescope.system.maps import read_maps

_SELINUX = "/sys/fs/selinux"


def process_problem(pid: int) -> str | None:
    """Why the engine must not touch process `pid`, or None."""
    fields = procfs.status_fields(pid)
    mode = fields.get("Seccomp", "0").strip()
    if mode not in ("", "0"):
        kind = "strict mode" if mode == "1" else "a filter"
        return (
            f"runs under seccomp ({kind}): the system calls the fentry engine injects and its "
            "stubs make could be refused or kill it"
        )
    try:
        maps = read_maps(pid)
    except (OSError, ProbescopeError) as error:
        return f"cannot read its memory map: {error}"
    paths = {m.path for m in maps if m.path and m.path.startswith("/")}
    if any("ld-musl" in p or "libc.musl" in p for p in paths):
        return "uses musl libc: the stubs read thread ids where glibc keeps them"
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        from probescope.symbols.entry_sites import EntrySites

        if EntrySites.for_path(f"/proc/{pid}/exe").is_go:
            return f"{exe} is a Go program: goroutine stacks are too small for a stub, and move"
    except Exception:  # an unreadable or odd exe is checked again when planning
        pass
    return selinux_problem()


def selinux_problem() -> str | None:
    try:
        with open(f"{_SELINUX}/enforce") as f:
            enforcing = f.read().strip() == "1"
        with open(f"{_SELINUX}/booleans/deny_execmem") as f:
            deny = f.read().split()[0] == "1"
    except OSError:
        return None
    if enforcing and deny:
        return "SELinux denies executable anonymous memory (deny_execmem): no code area"
    return None


def return_problem(world: StoppedProcess) -> str | None:
    """Why return probes cannot be hooked in this process (x86 user shadow stack)."""
    for tid in world.threads:
        if procfs.shadow_stack_enabled(tid):
            return (
                f"return probes disabled in process {world.pid}: the x86 user shadow stack "
                "(CET shstk) is on and a hooked return address would fault"
            )
    return None


def machine_notes() -> list[str]:
    """Settings that change how the engine works here (reported in the stats)."""
    notes = []
    try:
        with open("/proc/sys/vm/memfd_noexec") as f:
            value = f.read().strip()
        if value != "0":
            notes.append(
                f"vm.memfd_noexec={value}: the ring's memfd is created non-executable "
                "(MFD_NOEXEC_SEAL), as that setting allows"
            )
    except OSError:
        pass
    try:
        with open("/proc/cmdline") as f:
            cmdline = f.read().split()
    except OSError:
        cmdline = []
    for word in cmdline:
        if word.startswith("proc_mem.force_override="):
            value = word.partition("=")[2]
            if value == "never":
                notes.append(
                    "proc_mem.force_override=never: code is written with PTRACE_POKEDATA "
                    "(attach is slower)"
                )
    return notes
