"""Reading and writing one tracee address space.

Reads go through process_vm_readv, which honours page protections exactly like the kernel's
copy_from_user does for uprobe fetchargs. Code writes go through /proc/PID/mem (FOLL_FORCE: the
kernel copies the private file page and writes into the copy, so r-x text can be patched
without mprotect), falling back to PTRACE_POKEDATA when /proc/PID/mem writes are forbidden
(proc_mem.force_override=never). Stack writes use process_vm_writev so they fail where the
program itself would fault.
"""

from __future__ import annotations

import os
import struct

from probescope.engines.ptrace import syscalls
from probescope.errors import PtraceError

MAX_STRING_SIZE = 4096  # the kernel's MAX_STRING_SIZE (PATH_MAX)
_PAGE = 4096
_FIRST_CHUNK = 256


class TraceeMemory:
    """The memory of one address space, named by any thread id that lives in it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._reader = syscalls.RemoteReader()
        self._mem_fd: int | None = None
        self._poke_only = False
        self.closed = False

    def reopen(self, pid: int) -> None:
        """Point at a new address space (after exec, /proc/PID/mem still names the old one)."""
        self.close()
        self.pid = pid
        self.closed = False

    def close(self) -> None:
        if self._mem_fd is not None:
            try:
                os.close(self._mem_fd)
            except OSError:
                pass
            self._mem_fd = None
        self.closed = True

    # -- reads -------------------------------------------------------------------------------

    def read(self, address: int, size: int) -> bytes:
        """Up to `size` bytes; shorter when the range runs into unreadable memory."""
        return self._reader.read(self.pid, address, size)

    def read_exact(self, address: int, size: int) -> bytes | None:
        data = self._reader.read(self.pid, address, size)
        return data if len(data) == size else None

    def read_word(self, address: int) -> int | None:
        data = self._reader.read(self.pid, address, 8)
        if len(data) != 8:
            return None
        return int(struct.unpack("<Q", data)[0])

    def read_string(self, address: int, limit: int = MAX_STRING_SIZE) -> tuple[bytes, bool] | None:
        """(bytes before the NUL, NUL found within `limit` bytes) or None when the first byte
        cannot be read. Reads page by page so a string ending just before an unmapped page
        is still read, as strncpy_from_user does."""
        out = bytearray()
        cursor = address
        first = True
        while len(out) < limit:
            chunk = min(limit - len(out), _PAGE - (cursor % _PAGE))
            if first:
                chunk = min(chunk, _FIRST_CHUNK)  # most strings are short: copy little first
                first = False
            data = self._reader.read(self.pid, cursor, chunk)
            end = data.find(b"\0")
            if end >= 0:
                out += data[:end]
                return bytes(out), True
            out += data
            if len(data) < chunk:
                if not out:
                    return None
                return bytes(out), False
            cursor += chunk
        return bytes(out[:limit]), False

    # -- writes ------------------------------------------------------------------------------

    def write_code(self, address: int, data: bytes, stopped_tid: int | None = None) -> None:
        """Write into any mapping, including r-x text and our r-x XOL pages."""
        if self.closed:
            raise PtraceError(f"memory of process {self.pid} is no longer ours to write")
        if not self._poke_only:
            fd = self._open_mem()
            if fd is not None:
                try:
                    written = os.pwrite(fd, data, address)
                    if written == len(data):
                        return
                except OSError as error:
                    if error.errno not in (1, 5, 13):  # EPERM, EIO, EACCES: try POKEDATA
                        raise PtraceError(
                            f"cannot write {len(data)} bytes at 0x{address:x} in process "
                            f"{self.pid}: {syscalls.error_text(error.errno or 0)}"
                        ) from None
                self._poke_only = True
        self._poke(address, data, stopped_tid if stopped_tid is not None else self.pid)

    def add_u16(self, address: int, delta: int) -> bool:
        """Add `delta` to the unsigned short at `address` (a USDT semaphore); False on a fault."""
        data = self.read_exact(address, 2)
        if data is None:
            return False
        value = (struct.unpack("<H", data)[0] + delta) & 0xFFFF
        return self.write_data(address, struct.pack("<H", value))

    def write_data(self, address: int, data: bytes) -> bool:
        """Write where the program itself could write (stack, data); False on a fault."""
        if self.closed:
            return False
        return syscalls.remote_write(self.pid, address, data) == len(data)

    def _open_mem(self) -> int | None:
        if self._mem_fd is None:
            try:
                self._mem_fd = os.open(f"/proc/{self.pid}/mem", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return None
        return self._mem_fd

    def _poke(self, address: int, data: bytes, tid: int) -> None:
        start = address & ~7
        end = (address + len(data) + 7) & ~7
        for word_address in range(start, end, 8):
            word = syscalls.peek_word(tid, word_address)
            raw = bytearray(struct.pack("<Q", word))
            for i in range(8):
                a = word_address + i
                if address <= a < address + len(data):
                    raw[i] = data[a - address]
            syscalls.poke_word(tid, word_address, struct.unpack("<Q", bytes(raw))[0])
