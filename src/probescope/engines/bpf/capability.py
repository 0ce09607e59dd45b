"""What BPF can do on this kernel for this process, found by asking it: create the maps, load
the programs and attach the links the engine uses, to a throw-away file no process maps (so no
breakpoint is ever installed). Nothing is guessed from the kernel version; every refusal is
quoted in the reason."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import BPF_F_SLEEPABLE, AttachType, MapType, ProgramType
from probescope.engines.bpf.attach import (
    ProbePoint,
    attach_to_perf_event,
    attach_uprobe_multi,
    open_uprobe_event,
    uprobe_pmu_type,
)
from probescope.engines.bpf.insn import Emitter, Reg, exit_insn, mov64_imm
from probescope.errors import BpfError


@dataclass(frozen=True)
class BpfFeatures:
    """`usable`: uprobes can be traced (through uprobe_multi or the uprobe PMU); `reason` says
    why not, `hint` what to do; the rest qualifies what works."""

    usable: bool
    reason: str = ""
    hint: str | None = None
    uprobe_multi: bool = False
    uprobe_pmu: bool = False
    sleepable: bool = False
    notes: tuple[str, ...] = ()

    @property
    def attach_mode(self) -> str:
        return "uprobe_multi" if self.uprobe_multi else "uprobe PMU"


def _trivial(attach_type: AttachType, flags: int = 0) -> int:
    e = Emitter()
    e.emit(mov64_imm(Reg.R0, 0), exit_insn())
    return syscall.prog_load(
        ProgramType.KPROBE,
        e.assemble(),
        name="probescope_chk",
        expected_attach_type=attach_type,
        flags=flags,
    )


@contextlib.contextmanager
def _scratch_file() -> Iterator[str]:
    """A regular file of NOPs that no process maps: attaching there installs nothing."""
    fd, path = tempfile.mkstemp(prefix="probescope-bpf-check-")
    try:
        os.write(fd, b"\x90" * 64)
        os.close(fd)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def probe_features() -> BpfFeatures:
    try:
        fd = syscall.map_create(MapType.ARRAY, 4, 8, 1, name="probescope_chk")
    except BpfError as error:
        return BpfFeatures(False, f"the bpf() system call is refused: {error.message}", error.hint)
    syscall.close(fd)
    try:
        fd = syscall.map_create(MapType.RINGBUF, 0, 0, os.sysconf("SC_PAGE_SIZE"), name="chk")
    except BpfError as error:
        return BpfFeatures(
            False,
            f"no BPF ring buffer (Linux 5.8 and later have one): {error.message}",
        )
    syscall.close(fd)
    notes: list[str] = []
    with _scratch_file() as path:
        multi, multi_error = _try_uprobe_multi(path)
        sleepable = False
        if multi:
            sleepable = _loads_sleepable()
            if not sleepable:
                notes.append(
                    "programs cannot be sleepable here: an argument on a page the program has "
                    "not touched yet reads as a fault"
                )
        pmu, pmu_error = (False, "") if multi else _try_pmu(path)
    if not multi and not pmu:
        return BpfFeatures(
            False,
            f"cannot attach BPF to uprobes: uprobe_multi: {multi_error}; uprobe PMU: {pmu_error}",
            hint="uprobe_multi links need Linux 6.6; the uprobe PMU needs CAP_SYS_ADMIN",
        )
    if not multi:
        notes.append(f"uprobe_multi links are refused ({multi_error}); using the uprobe PMU")
    return BpfFeatures(
        True, uprobe_multi=multi, uprobe_pmu=pmu, sleepable=sleepable, notes=tuple(notes)
    )


def _try_uprobe_multi(path: str) -> tuple[bool, str]:
    try:
        program = _trivial(AttachType.TRACE_UPROBE_MULTI)
    except BpfError as error:
        return False, error.message
    try:
        link = attach_uprobe_multi(program, path, [ProbePoint(0, 0)], return_probe=False)
    except BpfError as error:
        return False, error.message
    finally:
        syscall.close(program)
    close_later([link])
    return True, ""


def _loads_sleepable() -> bool:
    """The verifier accepts a sleepable program only for attach types that may sleep: loading
    one for uprobe_multi is the test."""
    try:
        program = _trivial(AttachType.TRACE_UPROBE_MULTI, BPF_F_SLEEPABLE)
    except BpfError:
        return False
    syscall.close(program)
    return True


def close_later(fds: list[int]) -> None:
    """Close descriptors on a background thread: closing a link waits for RCU grace periods
    (35 ms here for one probe) that nothing needs to wait for."""

    def close_all() -> None:
        for fd in fds:
            syscall.close(fd)

    threading.Thread(target=close_all, daemon=True).start()


def _try_pmu(path: str) -> tuple[bool, str]:
    pmu_type = uprobe_pmu_type()
    if pmu_type is None:
        return False, "the kernel has no uprobe PMU"
    try:
        program = _trivial(AttachType.NONE)
    except BpfError as error:
        return False, error.message
    try:
        event = open_uprobe_event(pmu_type, path, ProbePoint(0, 0), return_probe=False)
    except BpfError as error:
        syscall.close(program)
        return False, error.message
    try:
        link = attach_to_perf_event(program, event, cookie=1)
    except BpfError as error:
        return False, error.message
    finally:
        syscall.close(program)
    close_later([event] if link is None else [link, event])
    return True, ""
