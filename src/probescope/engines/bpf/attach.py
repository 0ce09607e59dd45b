"""Attaching loaded programs: uprobe_multi links (one per binary and program: every offset of
the binary that runs the program, a cookie per offset naming its probe), the uprobe PMU as the
fallback where uprobe_multi is missing (one perf event and link per probe), and tracepoints
(a perf event of the event's id). Every attachment is a file descriptor: closing it detaches,
and so does the process dying.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass

from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import (
    PERF_ATTR_SIZE,
    PERF_EVENT_IOC_ENABLE,
    PERF_EVENT_IOC_SET_BPF,
    PERF_TYPE_TRACEPOINT,
    PerfAttr,
)
from probescope.errors import BpfError

UPROBE_PMU = "/sys/bus/event_source/devices/uprobe"


@dataclass(frozen=True)
class ProbePoint:
    """One probe as a link sees it: a file offset, its USDT semaphore, and its index."""

    offset: int
    index: int
    ref_ctr_offset: int = 0


def attach_uprobe_multi(
    program_fd: int,
    path: str,
    points: Sequence[ProbePoint],
    *,
    return_probe: bool,
    pid: int = 0,
) -> int:
    """One uprobe_multi link for all `points` of `path`. The kernel names no offset when it
    refuses one, so a refused link is retried point by point to say which."""
    ordered = sorted(points, key=lambda p: p.offset)
    try:
        return syscall.link_uprobe_multi(
            program_fd,
            path,
            [p.offset for p in ordered],
            [p.index for p in ordered],
            ref_ctr_offsets=[p.ref_ctr_offset for p in ordered],
            return_probe=return_probe,
            pid=pid,
        )
    except BpfError as error:
        if len(ordered) == 1 or error.errno not in (errno.EINVAL, errno.EBADF, errno.EFAULT):
            raise
        first_error = error
    refused = []
    for point in ordered:
        try:
            fd = syscall.link_uprobe_multi(
                program_fd,
                path,
                [point.offset],
                [point.index],
                ref_ctr_offsets=[point.ref_ctr_offset],
                return_probe=return_probe,
                pid=pid,
            )
        except BpfError as error:
            refused.append(f"0x{point.offset:x}: {error.message.rsplit(': ', 1)[-1]}")
        else:
            syscall.close(fd)
    raise BpfError(
        f"the kernel refused to attach to {path} at "
        + ("; ".join(refused) if refused else first_error.message),
        errno=first_error.errno,
        hint="an offset past the end of the file, or two probes at one offset with different "
        "USDT semaphores, are refused",
    )


def uprobe_pmu_type() -> int | None:
    """The perf event type of the uprobe PMU, None when the kernel has none."""
    try:
        with open(f"{UPROBE_PMU}/type") as text:
            return int(text.read())
    except (OSError, ValueError):
        return None


def _retprobe_bit() -> int:
    try:
        with open(f"{UPROBE_PMU}/format/retprobe") as text:
            spec = text.read().strip()  # "config:0"
        return int(spec.split(":", 1)[1].split("-")[0])
    except (OSError, ValueError, IndexError):
        return 0


def open_uprobe_event(pmu_type: int, path: str, point: ProbePoint, *, return_probe: bool) -> int:
    """A perf event of the uprobe PMU at `path`:`point.offset` in every process."""
    attr = syscall.Attr(PERF_ATTR_SIZE)
    attr.u32(PerfAttr.TYPE, pmu_type)
    attr.u32(PerfAttr.SIZE, PERF_ATTR_SIZE)
    config = (point.ref_ctr_offset << 32) if point.ref_ctr_offset else 0
    if return_probe:
        config |= 1 << _retprobe_bit()
    attr.u64(PerfAttr.CONFIG, config)
    path_buffer = ctypes.create_string_buffer(os.fsencode(path) + b"\0")
    attr.pointer(PerfAttr.CONFIG1, path_buffer)
    attr.u64(PerfAttr.CONFIG2, point.offset)
    attr.u64(PerfAttr.SAMPLE_PERIOD, 1)
    attr.u32(PerfAttr.WAKEUP_EVENTS, 1)
    return syscall.perf_event_open(
        attr, -1, 0, f"opening a uprobe perf event at {path}:0x{point.offset:x}"
    )


def open_tracepoint_event(tracepoint_id: int, label: str) -> int:
    attr = syscall.Attr(PERF_ATTR_SIZE)
    attr.u32(PerfAttr.TYPE, PERF_TYPE_TRACEPOINT)
    attr.u32(PerfAttr.SIZE, PERF_ATTR_SIZE)
    attr.u64(PerfAttr.CONFIG, tracepoint_id)
    attr.u64(PerfAttr.SAMPLE_PERIOD, 1)
    attr.u32(PerfAttr.WAKEUP_EVENTS, 1)
    return syscall.perf_event_open(attr, -1, 0, f"opening tracepoint {label}")


def attach_to_perf_event(program_fd: int, perf_fd: int, cookie: int = 0) -> int | None:
    """Run the program at each event of `perf_fd`: a BPF_PERF_EVENT link carrying `cookie`
    (returned), or on kernels before 5.15 PERF_EVENT_IOC_SET_BPF (None: the perf fd owns the
    attachment, and no cookie can be given)."""
    try:
        link = syscall.link_perf_event(program_fd, perf_fd, cookie)
    except BpfError as error:
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        if cookie:
            raise
        syscall.ioctl(perf_fd, PERF_EVENT_IOC_SET_BPF, program_fd, "attaching a program")
        link = None
    syscall.ioctl(perf_fd, PERF_EVENT_IOC_ENABLE, 0, "enabling a perf event")
    return link
