"""What probescope reads of a process in /proc besides its maps: status lines, comm, auxv,
threads, children, limits, environment, root directory, mount namespace and executable; plus the
Yama ptrace policy.

Readers of facts that may vanish with the process (status, comm, threads, limits) answer with
an empty value when it is gone; readers a caller cannot do without (auxv, root) raise
ProcessError.
"""

from __future__ import annotations

import os
import struct

from probescope.errors import ProcessError

AT_PHDR = 3
AT_PHNUM = 5
AT_BASE = 7
UNKNOWN_COMM = "<...>"


def process_exists(pid: int | str) -> bool:
    return os.path.exists(f"/proc/{pid}")


def status_fields(pid: int | str) -> dict[str, str]:
    """`/proc/PID/status` as {field: value}; empty when the process is gone."""
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except (FileNotFoundError, ProcessLookupError):
        pass
    return fields


def thread_group(tid: int) -> int | None:
    """The thread-group id (the process) a thread belongs to, or None when it is gone."""
    value = status_fields(tid).get("Tgid")
    return int(value) if value else None


def tracer_of(pid: int) -> int:
    """The pid of the process ptrace-attached to `pid`, or 0."""
    return int(status_fields(pid).get("TracerPid", "0") or 0)


def shadow_stack_enabled(pid: int) -> bool:
    """x86 user shadow stack (CET shstk) active in this thread (kernel ≥ 6.6 reports it)."""
    return "shstk" in status_fields(pid).get("x86_Thread_features", "").split()


def read_comm(tid: int) -> str:
    """The thread's command name (`/proc/TID/comm`), or `<...>` as the kernel prints an
    unknown one."""
    try:
        with open(f"/proc/{tid}/comm", "rb") as f:
            return f.read().rstrip(b"\n").decode("utf-8", "surrogateescape")
    except OSError:
        return UNKNOWN_COMM


def thread_ids(pid: int) -> list[int]:
    """The ids of the threads of process `pid`, sorted; empty when it is gone."""
    try:
        return sorted(int(name) for name in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def child_processes(pid: int) -> list[int]:
    """The processes whose parent is `pid`, sorted (its threads' `children` files when the
    kernel has them, CONFIG_PROC_CHILDREN; else every process's parent from `/proc/*/stat`)."""
    children: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    try:
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/children") as stream:
                children.update(int(word) for word in stream.read().split())
        return sorted(children)
    except FileNotFoundError:
        pass
    except OSError:
        return []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stream:
                parent = int(stream.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            children.add(int(entry))
    return sorted(children)


def descendant_processes(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), in the order they were found."""
    found: list[int] = []
    pending = child_processes(pid)
    while pending:
        child = pending.pop(0)
        if child in found or child == pid:
            continue
        found.append(child)
        pending += child_processes(child)
    return found


def read_auxv(pid: int) -> dict[int, int]:
    """The ELF auxiliary vector the kernel gave the process at exec (64-bit entries)."""
    try:
        with open(f"/proc/{pid}/auxv", "rb") as f:
            data = f.read()
    except OSError as error:
        raise ProcessError(f"cannot read /proc/{pid}/auxv: {error.strerror}") from None
    values = {}
    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack_from("<QQ", data, i)
        if key == 0:
            break
        values[key] = value
    return values


def stack_limit(pid: int) -> int | None:
    """The process's RLIMIT_STACK soft limit in bytes; None when unlimited or unknown."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max stack size"):
                    value = line.split()[3]
                    return None if value == "unlimited" else int(value)
    except OSError:
        pass
    return None


def environment_variable(pid: int, name: str) -> str | None:
    """One variable of the environment the process started with, or None."""
    prefix = name.encode("utf-8", "surrogateescape") + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            for item in stream.read().split(b"\0"):
                if item.startswith(prefix):
                    return item[len(prefix) :].decode("utf-8", "surrogateescape")
    except OSError:
        pass
    return None


def executable_path(pid: int) -> str | None:
    """The path of the process's executable as the kernel prints it, or None."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def executable_key(pid: int) -> tuple[int, int] | None:
    """(device, inode) of the process's executable — a Mapping.file_key — or None."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def process_root(pid: int | str) -> str:
    """The path prefix through which probescope sees files as process `pid` sees them.

    `""` when the process shares probescope's root directory and mount namespace, else
    `/proc/PID/root` — also for a process that kept our root but mounted its own filesystems
    (`unshare -m` and a tmpfs): paths through that link resolve in its mount namespace, for
    probescope and for the kernel's uprobe path lookup alike.
    """
    root = f"/proc/{pid}/root"
    try:
        theirs = os.stat(root)
    except OSError:
        if not process_exists(pid):
            raise ProcessError(f"no process with pid {pid}", hint="check the pid") from None
        raise ProcessError(
            f"cannot open {root}: permission denied",
            hint="looking into another user's process needs root (or CAP_SYS_PTRACE)",
        ) from None
    try:
        ours = os.stat("/")
    except OSError:
        return root
    if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
        return root
    return "" if same_mount_namespace(pid) else root


def same_mount_namespace(pid: int | str) -> bool:
    """Whether process `pid` sees the mounts probescope sees (True when it cannot be told)."""
    try:
        theirs = os.stat(f"/proc/{pid}/ns/mnt")
        ours = os.stat("/proc/self/ns/mnt")
    except OSError:
        return True
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def ptrace_scope() -> int | None:
    """kernel.yama.ptrace_scope (0 classic, 1 descendants only, 2 admin only, 3 none), or
    None without Yama."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None
