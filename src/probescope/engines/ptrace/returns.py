"""Return probes: hijacking a return address, and the kernel's return_instance bookkeeping.

At a return probe's entry hit (the function's first instruction) the return address at [sp]
is replaced by the trampoline's address and a ReturnInstance is pushed on the thread's shadow
stack. Entries whose frames were abandoned (longjmp, exceptions) are dropped by comparing stack
pointers exactly as the kernel's arch_uretprobe_is_alive does: alive iff `sp < stack` at a call,
`sp <= stack` at a return or a chained (tail) call. At most MAX_URETPROBE_DEPTH per thread.

Hijacked return addresses must never reach an exception unwinder: one that meets the
trampoline's address on the stack finds no unwind info for it and gives up (std::terminate for
C++). So when a thread enters the unwinder (`_Unwind_RaiseException` and friends in libgcc_s,
or linked statically: symbols/unwinder.py finds them) every hijacked return address of that
thread is put back (`expose`); when the exception is caught (`__cxa_begin_catch`) the frames
that survived — those above the stack pointer — are hijacked again, and the unwound ones
dropped like longjmp'd frames (`rehijack`).
"""

from __future__ import annotations

import struct

from probescope.engines.ptrace.tracee import Breakpoint, ReturnInstance, Thread

MAX_URETPROBE_DEPTH = 64


def hijack(thread: Thread, bp: Breakpoint, now: int) -> bool | None:
    """Hijack the return address of the function whose entry `bp` is; True when done,
    None when the depth limit omitted it, False when the stack could not be used."""
    process = thread.process
    trampoline = process.trampoline
    if trampoline is None:
        return False
    sp = int(thread.regs.rsp)
    original = process.memory.read_word(sp)
    if original is None:
        return False
    chained = original == trampoline
    shadow = thread.shadow
    if chained:
        while shadow and not sp <= shadow[-1].stack:
            shadow.pop()
    else:
        while shadow and not sp < shadow[-1].stack:
            shadow.pop()
    if len(shadow) >= MAX_URETPROBE_DEPTH:
        return None
    if chained:
        if not shadow:
            return False
        original = shadow[-1].original  # a tail call reuses its caller's hijack
    shadow.append(ReturnInstance(sp, original, bp, chained, now))
    if not chained and not process.memory.write_data(sp, struct.pack("<Q", trampoline)):
        shadow.pop()
        return False
    return True


def returned(thread: Thread) -> tuple[int, list[ReturnInstance]]:
    """The thread came back through the trampoline: (where it really returns to, the
    instances to report, innermost first). The kernel's handle_trampoline: the top chain
    (an instance and the tail calls chained to it) is reported if the next one down is still
    alive; chains of abandoned frames are dropped silently."""
    shadow = thread.shadow
    sp = int(thread.regs.rsp)
    original = 0
    while shadow:
        chain_start = len(shadow) - 1
        while chain_start > 0 and shadow[chain_start].chained:
            chain_start -= 1
        next_index = chain_start - 1
        valid = next_index < 0 or sp <= shadow[next_index].stack
        chain = shadow[chain_start:][::-1]
        del shadow[chain_start:]
        original = chain[0].original
        if valid:
            return original, chain
    return original, []


def expose(thread: Thread) -> None:
    """An exception starts unwinding: put every original return address back so the unwinder
    never meets the trampoline (it has no unwind info)."""
    process = thread.process
    for instance in thread.shadow:
        if instance.exposed:
            continue
        instance.exposed = True
        if not instance.chained and process.memory.read_word(instance.stack) == (
            process.trampoline
        ):
            process.memory.write_data(instance.stack, struct.pack("<Q", instance.original))


def rehijack(thread: Thread) -> None:
    """An exception was caught: frames below sp are gone, the others get their hijack back."""
    process = thread.process
    trampoline = process.trampoline
    sp = int(thread.regs.rsp)
    shadow = thread.shadow
    while shadow and not sp < shadow[-1].stack:
        shadow.pop()
    if trampoline is None:
        return
    for instance in shadow:
        if not instance.exposed:
            continue
        instance.exposed = False
        if not instance.chained and process.memory.read_word(instance.stack) == (instance.original):
            process.memory.write_data(instance.stack, struct.pack("<Q", trampoline))


def restore(thread: Thread) -> None:
    """Put back every return address still hijacked (detach, or a fork child let go)."""
    process = thread.process
    trampoline = process.trampoline
    for instance in thread.shadow:
        if instance.chained or instance.exposed:
            continue
        if process.memory.read_word(instance.stack) == trampoline:
            process.memory.write_data(instance.stack, struct.pack("<Q", instance.original))
    thread.shadow.clear()
