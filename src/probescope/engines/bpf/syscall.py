"""The bpf() and perf_event_open() system calls through ctypes, one function per command.

No libbpf and no headers: each call fills a zeroed `union bpf_attr` at the offsets listed in
`abi`, and a refusal becomes a `BpfError` that names the operation and the errno. Every object
the kernel returns is a file descriptor; closing it (or the process dying) releases it.
"""

from __future__ import annotations

import ctypes
import errno as errnos
import fcntl
import os
import platform
import struct
from collections.abc import Sequence

from probescope.engines.bpf.abi import (
    BPF_ANY,
    BPF_ATTR_SIZE,
    BPF_OBJ_NAME_LEN,
    PERF_FLAG_FD_CLOEXEC,
    SYSCALL_NUMBERS,
    AttachType,
    BatchAttr,
    Command,
    LinkCreateAttr,
    MapCreateAttr,
    MapElemAttr,
    MapType,
    ProgLoadAttr,
    ProgramType,
)
from probescope.engines.bpf.func_info import FUNC_INFO_RECORD, func_info_records, function_btf
from probescope.errors import BpfError, VerifierError

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_NUMBERS = SYSCALL_NUMBERS.get(platform.machine(), SYSCALL_NUMBERS["x86_64"])

VERIFIER_LOG_SIZE = 1 << 22
"""Bytes of verifier log asked for when a load fails (the kernel keeps the tail if longer)."""


class Attr:
    """A zeroed `union bpf_attr` (or any syscall argument block) filled field by field.

    Buffers whose addresses are stored in it are kept alive with it."""

    def __init__(self, size: int = BPF_ATTR_SIZE) -> None:
        self.buffer = ctypes.create_string_buffer(size)
        self.size = size
        self._kept: list[object] = []

    def u32(self, offset: int, value: int) -> None:
        struct.pack_into("<I", self.buffer, offset, value & 0xFFFFFFFF)

    def u64(self, offset: int, value: int) -> None:
        struct.pack_into("<Q", self.buffer, offset, value & 0xFFFFFFFFFFFFFFFF)

    def bytes_at(self, offset: int, data: bytes) -> None:
        ctypes.memmove(ctypes.addressof(self.buffer) + offset, data, len(data))

    def pointer(self, offset: int, data: bytes | ctypes.Array[ctypes.c_char] | None) -> None:
        """Store the address of `data` (copied into a C buffer if bytes) at `offset`."""
        if data is None:
            self.u64(offset, 0)
            return
        buffer = ctypes.create_string_buffer(data, len(data)) if isinstance(data, bytes) else data
        self._kept.append(buffer)
        self.u64(offset, ctypes.addressof(buffer))

    def read_u32(self, offset: int) -> int:
        return int(struct.unpack_from("<I", self.buffer, offset)[0])


def bpf(command: Command, attr: Attr, what: str) -> int:
    """bpf(command, attr): the result, or BpfError naming `what` failed and why."""
    result = _syscall(_NUMBERS["bpf"], int(command), attr.buffer, attr.size)
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(f"{what}: {_errno_text(code)}", errno=code, hint=_hint(code))
    return int(result)


def _errno_text(code: int) -> str:
    return f"{errnos.errorcode.get(code, str(code))} ({os.strerror(code)})"


def _hint(code: int) -> str | None:
    if code == errnos.EPERM:
        return "BPF needs root or CAP_BPF+CAP_PERFMON (kernel.unprivileged_bpf_disabled)"
    if code == errnos.ENOSYS:
        return "this kernel was built without CONFIG_BPF_SYSCALL"
    return None


# -- maps ---------------------------------------------------------------------------------------


def map_create(
    map_type: MapType,
    key_size: int,
    value_size: int,
    max_entries: int,
    *,
    flags: int = 0,
    name: str = "",
) -> int:
    attr = Attr()
    attr.u32(MapCreateAttr.MAP_TYPE, map_type)
    attr.u32(MapCreateAttr.KEY_SIZE, key_size)
    attr.u32(MapCreateAttr.VALUE_SIZE, value_size)
    attr.u32(MapCreateAttr.MAX_ENTRIES, max_entries)
    attr.u32(MapCreateAttr.MAP_FLAGS, flags)
    attr.bytes_at(MapCreateAttr.MAP_NAME, _object_name(name))
    return bpf(Command.MAP_CREATE, attr, f"creating {map_type.name.lower()} map {name!r}")


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value stored under `key`, or None when there is none."""
    value = ctypes.create_string_buffer(value_size)
    attr = Attr()
    attr.u32(MapElemAttr.MAP_FD, fd)
    attr.pointer(MapElemAttr.KEY, key)
    attr.pointer(MapElemAttr.VALUE, value)
    if not _unless_absent(Command.MAP_LOOKUP_ELEM, attr, "looking up a map element"):
        return None
    return value.raw


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    attr = Attr()
    attr.u32(MapElemAttr.MAP_FD, fd)
    attr.pointer(MapElemAttr.KEY, key)
    attr.pointer(MapElemAttr.VALUE, value)
    attr.u64(MapElemAttr.FLAGS, flags)
    bpf(Command.MAP_UPDATE_ELEM, attr, "updating a map element")


def map_delete(fd: int, key: bytes) -> bool:
    """Remove `key`; False when it was not there."""
    attr = Attr()
    attr.u32(MapElemAttr.MAP_FD, fd)
    attr.pointer(MapElemAttr.KEY, key)
    return _unless_absent(Command.MAP_DELETE_ELEM, attr, "deleting a map element")


def map_next_key(fd: int, key: bytes | None, key_size: int) -> bytes | None:
    """The key after `key` (the first key when None), or None at the end."""
    next_key = ctypes.create_string_buffer(key_size)
    attr = Attr()
    attr.u32(MapElemAttr.MAP_FD, fd)
    attr.pointer(MapElemAttr.KEY, key)
    attr.pointer(MapElemAttr.VALUE, next_key)
    if not _unless_absent(Command.MAP_GET_NEXT_KEY, attr, "walking a map's keys"):
        return None
    return next_key.raw


def _unless_absent(command: Command, attr: Attr, doing: str) -> bool:
    """Run a map command; False when the kernel says the key is not there (ENOENT)."""
    try:
        bpf(command, attr, doing)
    except BpfError as error:
        if error.errno == errnos.ENOENT:
            return False
        raise
    return True


def map_lookup_batch(
    fd: int, key_size: int, value_size: int, count: int, cursor: bytes | None
) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
    """Up to `count` (key, value) pairs after `cursor` (from the start when None) in one call,
    and the cursor for the next call (None when the map was read to its end)."""
    keys = ctypes.create_string_buffer(key_size * count)
    values = ctypes.create_string_buffer(value_size * count)
    out_batch = ctypes.create_string_buffer(max(key_size, 8))
    attr = Attr()
    attr.pointer(BatchAttr.IN_BATCH, cursor)
    attr.pointer(BatchAttr.OUT_BATCH, out_batch)
    attr.pointer(BatchAttr.KEYS, keys)
    attr.pointer(BatchAttr.VALUES, values)
    attr.u32(BatchAttr.COUNT, count)
    attr.u32(BatchAttr.MAP_FD, fd)
    done = False
    try:
        bpf(Command.MAP_LOOKUP_BATCH, attr, "reading a map in batches")
    except BpfError as error:
        if error.errno != errnos.ENOENT:
            raise
        done = True
    got = attr.read_u32(BatchAttr.COUNT)
    pairs = [
        (
            keys.raw[i * key_size : (i + 1) * key_size],
            values.raw[i * value_size : (i + 1) * value_size],
        )
        for i in range(got)
    ]
    return pairs, None if done else out_batch.raw


# -- programs -----------------------------------------------------------------------------------


def load_btf(blob: bytes) -> int:
    """BPF_BTF_LOAD: the blob's file descriptor (the kernel's log in the error when refused)."""
    log = ctypes.create_string_buffer(1 << 16)
    attr = Attr()
    attr.pointer(0, blob)
    attr.pointer(8, log)
    attr.u32(16, len(blob))
    attr.u32(20, len(log))
    attr.u32(24, 1)
    try:
        return bpf(Command.BTF_LOAD, attr, "loading the programs' BTF")
    except BpfError as error:
        raise BpfError(
            f"{error.message}: {log.value.decode(errors='replace').strip()}", errno=error.errno
        ) from None


def prog_load(
    program_type: ProgramType,
    instructions: bytes,
    *,
    name: str = "",
    license: str = "GPL",
    expected_attach_type: AttachType = AttachType.NONE,
    flags: int = 0,
    log_level: int = 0,
    functions: Sequence[int] = (0,),
) -> int:
    """Load a program. A refusal is reloaded with the verifier log on, and raised as a
    VerifierError carrying that log. `functions`: where each function starts (the main one at
    0); with more than one, the minimal BTF describing them goes along (see func_info)."""
    btf_fd = -1
    records = b""
    if len(functions) > 1:
        btf_fd = load_btf(function_btf([f"f{i}" for i in range(len(functions))]))
        records = func_info_records(functions)
    try:
        return _prog_load(
            program_type,
            instructions,
            name,
            license,
            expected_attach_type,
            flags,
            log_level,
            btf_fd,
            records,
            FUNC_INFO_RECORD.size if records else 0,
        )
    finally:
        if btf_fd >= 0:
            close(btf_fd)


def _prog_load(
    program_type: ProgramType,
    instructions: bytes,
    name: str,
    license: str,
    expected_attach_type: AttachType,
    flags: int,
    log_level: int,
    btf_fd: int,
    func_info: bytes,
    func_info_size: int,
) -> int:

    def attempt(level: int, log: ctypes.Array[ctypes.c_char] | None) -> int:
        attr = Attr()
        attr.u32(ProgLoadAttr.PROG_TYPE, program_type)
        attr.u32(ProgLoadAttr.INSN_CNT, len(instructions) // 8)
        attr.pointer(ProgLoadAttr.INSNS, instructions)
        attr.pointer(ProgLoadAttr.LICENSE, license.encode() + b"\0")
        attr.u32(ProgLoadAttr.LOG_LEVEL, level)
        attr.u32(ProgLoadAttr.PROG_FLAGS, flags)
        if log is not None:
            attr.u32(ProgLoadAttr.LOG_SIZE, len(log))
            attr.pointer(ProgLoadAttr.LOG_BUF, log)
        attr.bytes_at(ProgLoadAttr.PROG_NAME, _object_name(name))
        attr.u32(ProgLoadAttr.EXPECTED_ATTACH_TYPE, expected_attach_type)
        if func_info:
            attr.u32(ProgLoadAttr.PROG_BTF_FD, btf_fd)
            attr.u32(ProgLoadAttr.FUNC_INFO_REC_SIZE, func_info_size)
            attr.pointer(ProgLoadAttr.FUNC_INFO, func_info)
            attr.u32(ProgLoadAttr.FUNC_INFO_CNT, len(func_info) // func_info_size)
        return bpf(Command.PROG_LOAD, attr, f"loading program {name!r}")

    if log_level:
        log = ctypes.create_string_buffer(VERIFIER_LOG_SIZE)
        try:
            return attempt(log_level, log)
        except BpfError as error:
            raise _verifier_error(error, log) from None
    try:
        return attempt(0, None)
    except BpfError as error:
        if error.errno == errnos.EPERM:
            raise
    log = ctypes.create_string_buffer(VERIFIER_LOG_SIZE)
    try:
        fd = attempt(1, log)
    except BpfError as error:
        raise _verifier_error(error, log) from None
    return fd  # accepted with the log on: the first refusal was transient


def _verifier_error(error: BpfError, log: ctypes.Array[ctypes.c_char]) -> VerifierError:
    text = log.value.decode("utf-8", "replace")
    return VerifierError(error.message, errno=error.errno, log=text, hint=error.hint)


# -- links --------------------------------------------------------------------------------------


def link_uprobe_multi(
    program_fd: int,
    path: str,
    offsets: Sequence[int],
    cookies: Sequence[int],
    *,
    ref_ctr_offsets: Sequence[int] | None = None,
    return_probe: bool = False,
    pid: int = 0,
) -> int:
    """One link attaching `program_fd` at every file offset of `path` (a uprobe_multi link):
    cookie i identifies offset i to the program, `pid` (0: every process) limits the hits."""
    from probescope.engines.bpf.abi import BPF_F_UPROBE_MULTI_RETURN

    count = len(offsets)
    attr = Attr()
    attr.u32(LinkCreateAttr.PROG_FD, program_fd)
    attr.u32(LinkCreateAttr.ATTACH_TYPE, AttachType.TRACE_UPROBE_MULTI)
    attr.pointer(LinkCreateAttr.UPROBE_MULTI_PATH, os.fsencode(path) + b"\0")
    attr.pointer(LinkCreateAttr.UPROBE_MULTI_OFFSETS, struct.pack(f"<{count}Q", *offsets))
    if ref_ctr_offsets is not None and any(ref_ctr_offsets):
        attr.pointer(
            LinkCreateAttr.UPROBE_MULTI_REF_CTR_OFFSETS,
            struct.pack(f"<{count}Q", *ref_ctr_offsets),
        )
    attr.pointer(LinkCreateAttr.UPROBE_MULTI_COOKIES, struct.pack(f"<{count}Q", *cookies))
    attr.u32(LinkCreateAttr.UPROBE_MULTI_CNT, count)
    attr.u32(LinkCreateAttr.UPROBE_MULTI_FLAGS, BPF_F_UPROBE_MULTI_RETURN if return_probe else 0)
    attr.u32(LinkCreateAttr.UPROBE_MULTI_PID, pid)
    kind = "uretprobe" if return_probe else "uprobe"
    return bpf(Command.LINK_CREATE, attr, f"attaching {count} {kind}s to {path}")


def link_perf_event(program_fd: int, perf_fd: int, cookie: int = 0) -> int:
    """A BPF_PERF_EVENT link: the program runs at every event of `perf_fd`, with `cookie`."""
    attr = Attr()
    attr.u32(LinkCreateAttr.PROG_FD, program_fd)
    attr.u32(LinkCreateAttr.TARGET_FD, perf_fd)
    attr.u32(LinkCreateAttr.ATTACH_TYPE, AttachType.PERF_EVENT)
    attr.u64(LinkCreateAttr.PERF_EVENT_BPF_COOKIE, cookie)
    return bpf(Command.LINK_CREATE, attr, "attaching a program to a perf event")


# -- perf events --------------------------------------------------------------------------------


def perf_event_open(attr: Attr, pid: int, cpu: int, what: str, group_fd: int = -1) -> int:
    result = _syscall(
        _NUMBERS["perf_event_open"],
        attr.buffer,
        ctypes.c_int(pid),
        ctypes.c_int(cpu),
        ctypes.c_int(group_fd),
        ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
    )
    if result < 0:
        code = ctypes.get_errno()
        hint = None
        if code in (errnos.EPERM, errnos.EACCES):
            hint = "perf events need root or CAP_PERFMON (the uprobe PMU: CAP_SYS_ADMIN)"
        raise BpfError(f"{what}: {_errno_text(code)}", errno=code, hint=hint)
    return int(result)


def ioctl(fd: int, request: int, argument: int, what: str) -> None:
    try:
        fcntl.ioctl(fd, request, argument)
    except OSError as error:
        code = error.errno or errnos.EINVAL
        raise BpfError(f"{what}: {_errno_text(code)}", errno=code) from None


def close(fd: int) -> None:
    """Close a descriptor we own; an already closed one is not an error here."""
    try:
        os.close(fd)
    except OSError:
        pass


def _object_name(name: str) -> bytes:
    """A kernel object name: at most 15 characters of [A-Za-z0-9_.] (others become '_')."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.") else "_" for c in name)
    return cleaned.encode()[: BPF_OBJ_NAME_LEN - 1]
