"""The dynamic linker's library cache (`/etc/ld.so.cache`): soname → path, as ld.so looks it up.

Format (glibc `sysdeps/generic/dl-cache.h`): optionally the old libc5 table (`ld.so-1.7.0`,
12-byte entries), then the new table `glibc-ld.so.cache1.1`: nlibs, string-table length, an
endianness flag byte, padding to 48 bytes, then 24-byte entries {int32 flags; uint32 key, value;
uint32 osversion; uint64 hwcap} whose key/value are offsets of NUL-terminated strings counted
from the start of the new header. When the file cannot be parsed, `ldconfig -p` is asked.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
DEFAULT_PATH = "/etc/ld.so.cache"
FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003


class LdCacheEntry(NamedTuple):
    """One library the cache knows: the file name looked up (`libc.so.6`) and its path."""

    name: str
    path: str
    flags: int
    hwcap: int


def read_ld_cache(path: str = DEFAULT_PATH) -> list[LdCacheEntry]:
    """Entries of the cache at `path` (empty when there is none); ldconfig -p as a fallback."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError:
        return _from_ldconfig() if path == DEFAULT_PATH else []
    entries = parse_ld_cache(data)
    if entries is None:
        return _from_ldconfig() if path == DEFAULT_PATH else []
    return entries


def parse_ld_cache(data: bytes) -> list[LdCacheEntry] | None:
    """Entries of a cache image, or None when the bytes are not a cache this parser knows."""
    start = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < 16:
            return None
        (old_count,) = struct.unpack_from("<I", data, 12)
        start = 16 + old_count * 12
        start = (start + 7) & ~7
        if not data.startswith(NEW_MAGIC, start):
            return _parse_old(data, old_count)
    if not data.startswith(NEW_MAGIC, start) or len(data) < start + 48:
        return None
    endian = ">" if data[start + 28] & 3 == 3 else "<"
    (count,) = struct.unpack_from(f"{endian}I", data, start + 20)
    first = start + 48
    if first + count * 24 > len(data):
        return None
    entries = []
    entry = struct.Struct(f"{endian}iIIIQ")
    for index in range(count):
        flags, key, value, _osversion, hwcap = entry.unpack_from(data, first + index * 24)
        name = _string(data, start + key)
        target = _string(data, start + value)
        if name is None or target is None:
            return None
        entries.append(LdCacheEntry(name, target, flags, hwcap))
    return entries


def _parse_old(data: bytes, count: int) -> list[LdCacheEntry] | None:
    strings = 16 + count * 12
    if strings > len(data):
        return None
    entries = []
    for index in range(count):
        flags, key, value = struct.unpack_from("<iII", data, 16 + index * 12)
        name, target = _string(data, strings + key), _string(data, strings + value)
        if name is None or target is None:
            return None
        entries.append(LdCacheEntry(name, target, flags, 0))
    return entries


def _string(data: bytes, offset: int) -> str | None:
    if not 0 <= offset < len(data):
        return None
    end = data.find(b"\0", offset)
    if end < 0:
        return None
    return data[offset:end].decode("utf-8", "surrogateescape")


def _from_ldconfig() -> list[LdCacheEntry]:
    """Parse `ldconfig -p`: `\\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1`."""
    import shutil
    import subprocess

    tool = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if tool is None:
        return []
    try:
        result = subprocess.run([tool, "-p"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    entries = []
    for line in result.stdout.splitlines()[1:]:
        left, arrow, right = line.strip().partition(" => ")
        if not arrow:
            continue
        name = left.split(" (", 1)[0].strip()
        entries.append(LdCacheEntry(name, right.strip(), FLAG_ELF_LIBC6, 0))
    return entries
