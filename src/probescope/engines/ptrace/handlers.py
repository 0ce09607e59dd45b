"""HitContext: what a Python handler sees while the probed thread is stopped.

A handler registered with `PtraceEngine.on(probe, fn)` is called as `fn(ctx)` after the hit's
fetchargs were evaluated and before the probed instruction runs — like a kprobe pre_handler for
entry probes and a ret_handler for return probes. It can read and write registers and memory,
and change what the function returns. Changes to registers take effect when the thread resumes;
if a handler moves the instruction pointer, the probed instruction is not executed (the kernel's
uprobe rule: "if user decided to take execution elsewhere, ... skip it").
"""

from __future__ import annotations

import struct
from typing import Any

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace.tracee import Breakpoint, ProbeSite, ReturnInstance, Thread
from probescope.errors import PtraceError
from probescope.language.resolved import ResolvedProbe


class HitContext:
    """One hit of one probe in one thread, for the duration of a handler call."""

    def __init__(
        self,
        thread: Thread,
        site: ProbeSite,
        breakpoint: Breakpoint,
        timestamp_ns: int,
        args: tuple[Any, ...],
        return_instance: ReturnInstance | None = None,
    ) -> None:
        self._thread = thread
        self._site = site
        self._breakpoint = breakpoint
        self._return = return_instance
        self.timestamp_ns = timestamp_ns
        self.args = args

    # -- what was hit ------------------------------------------------------------------------

    @property
    def probe(self) -> ResolvedProbe:
        return self._site.probe

    @property
    def pid(self) -> int:
        return self._thread.tgid

    @property
    def tid(self) -> int:
        return self._thread.tid

    @property
    def comm(self) -> str:
        return self._thread.current_comm()

    @property
    def is_return(self) -> bool:
        return self._return is not None

    @property
    def address(self) -> int:
        """Runtime address of the probe (for a return probe: of the function)."""
        return self._breakpoint.address

    @property
    def return_address(self) -> int | None:
        """Where the function returns to in its caller (return probes only)."""
        return self._return.original if self._return is not None else None

    @property
    def entry_timestamp_ns(self) -> int | None:
        """When the matching entry was hit (return probes only)."""
        return self._return.entry_ns if self._return is not None else None

    def arg(self, name: str) -> Any:
        return self.args[self._site.event_type.arg_names.index(name)]

    # -- registers ---------------------------------------------------------------------------

    def reg(self, name: str) -> int:
        """A register by kernel name (`di`, `ax`, `ip`, `flags`) or assembler name (`rdi`)."""
        return int(getattr(self._thread.regs, arch.register_field(name)))

    def set_reg(self, name: str, value: int) -> None:
        setattr(self._thread.regs, arch.register_field(name), value & arch.U64)

    @property
    def retval(self) -> int:
        return arch.return_value(self._thread.regs)

    def override_return(self, value: int) -> None:
        """Make the function return `value`.

        On a return probe this sets the return register. On an entry probe (which must sit on
        the function's first instruction) the function is skipped: the return register is set
        and a `ret` is emulated, so the caller continues as if the function had returned.
        """
        regs = self._thread.regs
        regs.rax = value & arch.U64
        if self._return is not None:
            return
        sp = int(regs.rsp)
        data = self._thread.process.memory.read_exact(sp, 8)
        if data is None:
            raise PtraceError(f"cannot read the return address at sp=0x{sp:x}")
        regs.rip = struct.unpack("<Q", data)[0]
        regs.rsp = sp + 8

    # -- memory ------------------------------------------------------------------------------

    def read(self, address: int, size: int) -> bytes:
        data = self._thread.process.memory.read_exact(address, size)
        if data is None:
            raise PtraceError(f"cannot read {size} bytes at 0x{address:x} in {self.pid}")
        return data

    def read_u64(self, address: int) -> int:
        return int(struct.unpack("<Q", self.read(address, 8))[0])

    def read_string(self, address: int, limit: int = 4096) -> bytes | None:
        got = self._thread.process.memory.read_string(address, limit)
        return None if got is None else got[0]

    def write(self, address: int, data: bytes) -> None:
        """Write into the tracee (any mapping, code included)."""
        self._thread.process.memory.write_code(address, data, self._thread.tid)
