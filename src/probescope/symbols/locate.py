"""Turning what a user types (`bash`, `c`, `libssl.so.3`, `./a.out`) into the ELF file to probe.

Order: a name with a `/` is a path; otherwise, with a pid, the files that process has mapped
(so `c` is the libc it really uses, in its container if it runs in one), then a command on
PATH, then a library from the ld.so cache and the standard library directories. Files of a
process in another root or mount namespace are returned as `/proc/PID/root/...` — the path
the kernel needs. A path the process runs a deleted copy of (a binary replaced or removed while
it runs) is its `/proc/PID/exe` or `/proc/PID/map_files/...` link, which reach the inode it
runs; without a pid, the error names the processes that run one. A name that matches several
different files is an error listing them, never a guess.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING

from probescope.errors import ProcessError, SymbolError
from probescope.symbols.elfimage import ELF_MAGIC
from probescope.symbols.ldcache import read_ld_cache
from probescope.symbols.maps import map_files_path, mapped_file_path
from probescope.system.maps import read_maps
from probescope.system.procfs import environment_variable, process_root

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBRARY_DIRS = (
    "/lib/{triplet}",
    "/usr/lib/{triplet}",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
)
_TRIPLETS = {
    62: "x86_64-linux-gnu",
    183: "aarch64-linux-gnu",
    3: "i386-linux-gnu",
    40: "arm-linux-gnueabihf",
    243: "riscv64-linux-gnu",
}


def locate_binary(target: str, pid: int | None = None, *, root: str | None = None) -> Path:
    """The ELF file `target` names, as seen by process `pid` when given (see module doc).

    `root` looks inside another root directory instead (an unpacked image, a sysroot); the
    result then starts with it, like `/proc/PID/root/...` paths do.
    """
    if not target:
        raise SymbolError("empty target", hint="name a binary, a command or a library")
    if root is not None and pid is not None:
        raise SymbolError("give either a pid or a root directory, not both")
    try:
        return _locate(target, pid, root)
    except ProcessError as error:  # the process exited or is not ours: the target is not found
        raise SymbolError(error.message, hint=error.hint) from None


def _locate(target: str, pid: int | None, root: str | None) -> Path:
    if root is None:
        root = "" if pid is None else process_root(pid)
    root = root.rstrip("/")
    if "/" in target:
        if pid is not None:
            running = _deleted_copy(pid, target)
            if running is not None:
                return _checked(running, target, pid)
        return _checked(_under_root(root, target) if os.path.isabs(target) else target, target, pid)
    if pid is not None:
        mapped = _mapped_candidates(pid, root, target)
        if len(mapped) == 1:
            return _as_path(mapped[0])
        if len(mapped) > 1:
            raise _ambiguous(target, mapped, f"mapped by process {pid}")
    if not _looks_like_library(target):
        command = _command(root, target, pid)
        if command is not None:
            return command
    libraries = _library_candidates(root, target, pid)
    if len(libraries) == 1:
        return _as_path(libraries[0])
    if len(libraries) > 1:
        raise _ambiguous(target, libraries, "in the ld.so cache and library directories")
    raise _not_found(target, root, pid)


def _under_root(root: str, path: str) -> str:
    return root + path if root else path


def _checked(path: str, target: str, pid: int | None) -> Path:
    where = f" (inside the root of process {pid})" if pid is not None else ""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        hint = "check the path, or give a command name"
        running = _processes_running_deleted(target) if pid is None else []
        if running:
            listing = ", ".join(f"{p} ({comm})" for p, comm in running[:5])
            hint = (
                f"deleted while it runs in process {listing}: give -p {running[0][0]} "
                f"(probescope then probes it through /proc/{running[0][0]}/exe)"
            )
        raise SymbolError(f"no such file: {target!r}{where}", hint=hint) from None
    except OSError as error:
        raise SymbolError(f"cannot access {target!r}{where}: {error.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise SymbolError(f"{target!r} is a directory", hint="name the binary inside it")
    if not stat.S_ISREG(st.st_mode):
        raise SymbolError(f"{target!r} is not a regular file", hint="uprobes need a regular file")
    try:
        with open(path, "rb") as stream:
            head = stream.read(256)
    except OSError as error:
        raise SymbolError(f"cannot read {target!r}: {error.strerror}") from None
    if head[:4] != ELF_MAGIC:
        if head.startswith(b"#!"):
            line = head[2:].split(b"\n", 1)[0].strip().decode("utf-8", "replace")
            words = line.split()
            interpreter = words[1] if len(words) > 1 and words[0].endswith("/env") else line
            raise SymbolError(
                f"{path!r} is a script (#!{line}), not an ELF binary",
                hint=f"probe the program it runs (its interpreter is {interpreter})",
            )
        raise SymbolError(
            f"{target!r} is not an ELF file", hint="uprobes attach to executables and libraries"
        )
    return _as_path(os.path.abspath(path))


def _deleted_copy(pid: int, target: str) -> str | None:
    """A path to the deleted file process `pid` maps under the name `target` (`/proc/PID/exe`
    for its executable, else the mapping's map_files link), or None when it maps no deleted
    file of that name."""
    wanted = os.path.normpath(target if os.path.isabs(target) else os.path.abspath(target))
    for mapping in read_maps(pid):
        if not mapping.deleted or not mapping.is_file or mapping.path != wanted:
            continue
        try:
            executable = os.stat(f"/proc/{pid}/exe")
        except OSError:
            executable = None
        if executable is not None and executable.st_ino == mapping.inode:
            return f"/proc/{pid}/exe"
        return map_files_path(pid, mapping)
    return None


def _processes_running_deleted(target: str) -> list[tuple[int, str]]:
    """(pid, comm) of the processes whose executable is the deleted file `target`."""
    wanted = os.path.normpath(os.path.abspath(target)) + " (deleted)"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/exe") != wanted:
                continue
            with open(f"/proc/{entry}/comm") as stream:
                found.append((int(entry), stream.read().strip()))
        except OSError:
            continue
    return sorted(found)


def _as_path(path: str) -> Path:
    from pathlib import Path  # only here: pathlib costs milliseconds of import time

    return Path(path)


def _looks_like_library(name: str) -> bool:
    return name.startswith("lib") or ".so" in name


def library_name_matches(file_name: str, target: str) -> bool:
    """Whether a library file name answers to `target` (`c`, `libc`, `libc.so.6`, `ssl`)."""
    if ".so" in target:
        return file_name == target
    stem = target if target.startswith("lib") else f"lib{target}"
    return file_name == f"{stem}.so" or file_name.startswith(f"{stem}.so.")


def _mapped_candidates(pid: int, root: str, target: str) -> list[str]:
    """Distinct files mapped by `pid` whose name is `target` or a library name for it."""
    found: dict[tuple[int, int], str] = {}
    for mapping in read_maps(pid):
        if not mapping.is_file or mapping.path is None:
            continue
        name = os.path.basename(mapping.path)
        if (mapping.device, mapping.inode) in found:
            continue
        if name == target or library_name_matches(name, target):
            path = mapped_file_path(pid, mapping, root)
            if path is None and mapping.deleted:
                path = map_files_path(pid, mapping)
            if path is not None:
                found[(mapping.device, mapping.inode)] = path
    return sorted(set(found.values()))


def _command(root: str, name: str, pid: int | None) -> Path | None:
    search = os.environ.get("PATH", DEFAULT_PATH) if pid is None else _process_path(pid)
    found = []
    for directory in search.split(os.pathsep):
        candidate = _under_root(root, os.path.join(directory or ".", name))
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found.append(candidate)
    if not found:
        return None
    try:
        return _checked(found[0], name, pid)
    except SymbolError as error:
        binaries: dict[str, str] = {}
        for candidate in found[1:]:
            if _machine_of(candidate) is not None:
                binaries.setdefault(os.path.realpath(candidate), candidate)
        if binaries:
            error.hint = (error.hint or "") + "; ELF files of that name later on PATH: "
            error.hint += ", ".join(binaries.values())
        raise


def _process_path(pid: int) -> str:
    """PATH from the process's environment, else the default one."""
    value = environment_variable(pid, "PATH")
    return DEFAULT_PATH if value is None else value


def _machine_of(path: str) -> tuple[int, int] | None:
    """(ELF class, e_machine) of a file, read from its first 20 bytes."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != ELF_MAGIC:
        return None
    return head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def _library_candidates(root: str, target: str, pid: int | None) -> list[str]:
    """Distinct ELF files for the library `target` of the right class and machine."""
    wanted = _machine_of(f"/proc/{'self' if pid is None else pid}/exe")
    if wanted is None:
        wanted = _machine_of("/proc/self/exe")
    names: list[str] = []
    for entry in read_ld_cache(_under_root(root, "/etc/ld.so.cache")):
        if library_name_matches(entry.name, target):
            names.append(_under_root(root, entry.path))
    triplet = _TRIPLETS.get(wanted[1], "") if wanted else ""
    for template in LIBRARY_DIRS:
        directory = _under_root(root, template.format(triplet=triplet))
        names += [os.path.join(directory, n) for n in _matching_files(directory, target)]
    found: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            st = os.stat(name)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in found:
            continue
        machine = _machine_of(name)
        if machine is None or (wanted is not None and machine != wanted):
            continue
        found[(st.st_dev, st.st_ino)] = name
    return sorted(found.values())


def _matching_files(directory: str, target: str) -> Iterable[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return ()
    return [n for n in names if library_name_matches(n, target)]


def _ambiguous(target: str, candidates: list[str], where: str) -> SymbolError:
    listing = ", ".join(candidates[:10]) + (" …" if len(candidates) > 10 else "")
    return SymbolError(
        f"{target!r} is ambiguous: {len(candidates)} different files {where}: {listing}",
        hint="give the full path or the exact file name (e.g. libssl.so.3)",
    )


def _not_found(target: str, root: str, pid: int | None) -> SymbolError:
    import difflib

    known = {e.name for e in read_ld_cache(_under_root(root, "/etc/ld.so.cache"))}
    stems = {n.split(".so", 1)[0] for n in known}
    query = target if target.startswith("lib") else f"lib{target}"
    close = difflib.get_close_matches(query.split(".so", 1)[0], sorted(stems), n=4, cutoff=0.75)
    hints = []
    if close:
        hints.append("did you mean " + ", ".join(close) + "?")
    hints.append("give a path, a command on PATH or a library name such as c, libc, libc.so.6")
    where = "" if pid is None else f" for process {pid}"
    return SymbolError(
        f"cannot find {target!r}{where}: not a command on PATH nor a library in the ld.so cache",
        hint="; ".join(hints),
    )
