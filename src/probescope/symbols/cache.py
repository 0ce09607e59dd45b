"""The persistent symbol-table cache: one file per binary, checked against the file's identity.

A cached table is valid while the binary keeps its (device, inode, mtime, size) and every debug
file candidate looked at when it was built is unchanged (a -dbgsym installed later invalidates
it). Entries are written to a temporary file and renamed into place, so concurrent writers and
readers only ever see whole files; a file that fails its CRC or does not decode is a miss.
The payload is `marshal`led plain tuples: loading libc's table takes about a millisecond.
"""

from __future__ import annotations

import marshal
import os
import struct
import time
import zlib
from collections.abc import Sequence
from typing import Any

from probescope.symbols.identity import FileIdentity, stat_identity

CACHE_DIR_ENV = "PROBESCOPE_CACHE_DIR"
FORMAT = 8
_MAGIC = b"PSSYMTAB"
_HEADER = struct.Struct("<8sII")  # magic, format, crc32 of the payload
MAX_ENTRIES = 512


def cache_dir() -> str:
    """`$PROBESCOPE_CACHE_DIR`, else `$XDG_CACHE_HOME/probescope/symbols`, else ~/.cache/…"""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "probescope", "symbols")


def entry_path(identity: FileIdentity, debug_dirs: Sequence[str]) -> str:
    """The cache file of one binary (by device and inode) under one debug-directory list."""
    dirs = zlib.crc32("\0".join(debug_dirs).encode("utf-8", "surrogateescape"))
    name = f"{identity.device:x}-{identity.inode:x}-{dirs:08x}.symtab"
    return os.path.join(cache_dir(), name)


Dependencies = tuple[tuple[str, tuple[int, int, int, int] | None], ...]


def dependencies(paths: Sequence[str]) -> Dependencies:
    """The current identity (or absence) of each path, as stored beside a table."""
    found: list[tuple[str, tuple[int, int, int, int] | None]] = []
    for path in paths:
        identity = stat_identity(path)
        found.append((path, None if identity is None else (*identity,)))
    return tuple(found)


def load(identity: FileIdentity, debug_dirs: Sequence[str]) -> tuple[Dependencies, Any] | None:
    """(dependencies, state) cached for this exact file, or None (missing, stale, corrupt)."""
    try:
        with open(entry_path(identity, debug_dirs), "rb") as stream:
            blob = stream.read()
    except OSError:
        return None
    if len(blob) < _HEADER.size:
        return None
    magic, fmt, crc = _HEADER.unpack_from(blob)
    payload = memoryview(blob)[_HEADER.size :]
    if magic != _MAGIC or fmt != FORMAT or zlib.crc32(payload) != crc:
        return None
    try:
        stored_identity, stored_dirs, deps, state = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    if tuple(stored_identity) != tuple(identity) or tuple(stored_dirs) != tuple(debug_dirs):
        return None
    for path, before in deps:
        now = stat_identity(path)
        if (None if now is None else tuple(now)) != (None if before is None else tuple(before)):
            return None
    return deps, state


def store(
    identity: FileIdentity, debug_dirs: Sequence[str], deps: Dependencies, state: Any
) -> bool:
    """Write `state` for this file atomically; False (and nothing written) when it cannot."""
    target = entry_path(identity, debug_dirs)
    directory, name = os.path.split(target)
    payload = marshal.dumps((tuple(identity), tuple(debug_dirs), deps, state))
    blob = _HEADER.pack(_MAGIC, FORMAT, zlib.crc32(payload)) + payload
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.{time.monotonic_ns()}")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return False
    _prune(directory)
    return True


def _prune(directory: str) -> None:
    """Keep the newest MAX_ENTRIES tables; drop stale temporaries of crashed writers."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    now = time.time()
    tables = []
    for entry in entries:
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if entry.name.startswith(".") and now - mtime > 600:
            _unlink(entry.path)
        elif entry.name.endswith(".symtab"):
            tables.append((mtime, entry.path))
    if len(tables) > MAX_ENTRIES:
        tables.sort()
        for _, path in tables[: len(tables) - MAX_ENTRIES * 3 // 4]:
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def clear() -> int:
    """Remove every cached table; returns how many were removed."""
    removed = 0
    directory = cache_dir()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.endswith(".symtab") or entry.name.startswith("."):
            _unlink(entry.path)
            removed += 1
    return removed
