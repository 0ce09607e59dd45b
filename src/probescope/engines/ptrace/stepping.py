"""The single-step fallback, the kernel's way: a rewritten copy of the instruction in a slot,
one PTRACE_SINGLESTEP, then FIX_IP/FIX_CALL fixups and the scratch register put back.

Used for what a static slot cannot hold (a RIP-relative operand out of ±2 GiB of the slot, far
branches) and, on request, for every displaced instruction (`single_step=True`, to compare).
"""

from __future__ import annotations

import struct

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace.insn_x86_64 import FIX_CALL, FIX_IP
from probescope.engines.ptrace.tracee import Breakpoint, StepInFlight, Thread


def prepare(thread: Thread, bp: Breakpoint) -> None:
    """Point the thread's registers at the step copy; the caller stores and single-steps."""
    plan = bp.step_plan
    assert plan is not None and bp.step_slot is not None
    regs = thread.regs
    saved = None
    if plan.scratch is not None:
        saved = int(getattr(regs, plan.scratch))
        setattr(regs, plan.scratch, bp.instruction.next_ip)
    regs.rip = bp.step_slot
    thread.step = StepInFlight(bp, bp.step_slot, saved)


def fix_up(thread: Thread, step: StepInFlight) -> None:
    """After the step: registers as if the original instruction had run in place."""
    regs = thread.regs
    bp = step.breakpoint
    plan = bp.step_plan
    assert plan is not None
    correction = bp.address - step.slot
    if plan.scratch is not None and step.saved_scratch is not None:
        setattr(regs, plan.scratch, step.saved_scratch)
    if plan.fixups & FIX_IP:
        regs.rip = (int(regs.rip) + correction) & arch.U64
    if plan.fixups & FIX_CALL:
        sp = int(regs.rsp)
        pushed = thread.process.memory.read_word(sp)
        if pushed is not None:
            thread.process.memory.write_data(
                sp, struct.pack("<Q", (pushed + correction) & arch.U64)
            )


def abort(thread: Thread) -> None:
    """The copy did not run (it faulted, or we detach): back to the probe site."""
    step = thread.step
    assert step is not None
    thread.step = None
    plan = step.breakpoint.step_plan
    if plan is not None and plan.scratch is not None and step.saved_scratch is not None:
        setattr(thread.regs, plan.scratch, step.saved_scratch)
    thread.regs.rip = step.breakpoint.address
