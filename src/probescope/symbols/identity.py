"""FileIdentity: which file a path names right now — the key uprobes, maps and the cache agree on.

The kernel keys a uprobe on the inode, `/proc/PID/maps` prints (device, inode), and a cached
symbol table is only valid while the file keeps its inode, modification time and size.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from probescope.errors import SymbolError


class FileIdentity(NamedTuple):
    device: int
    inode: int
    mtime_ns: int
    size: int

    @property
    def key(self) -> tuple[int, int]:
        """(device, inode): what `/proc/PID/maps` shows for a mapping of this file."""
        return self.device, self.inode


def file_identity(path: str | os.PathLike[str]) -> FileIdentity:
    """(device, inode, mtime_ns, size) of the file `path` names, following symlinks."""
    try:
        st = os.stat(path)
    except OSError as error:
        raise SymbolError(
            f"cannot stat {os.fspath(path)!r}: {error.strerror}",
            hint="check the path (for a process in a container use /proc/PID/root/PATH)",
        ) from None
    return FileIdentity(st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def stat_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """Like file_identity, but None when the file does not exist or cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileIdentity(st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
