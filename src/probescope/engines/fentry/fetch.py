"""Fetchargs computed from a record, with the kernel's types; what a record cannot hold is refused.

A stub records the argument registers, %ax, %sp and the three words above %sp — no memory
reads (a fault inside a stub would kill the program, and the stub cannot recover the way the
kernel's copy_from_user does). So an argument is taken when it reads %di %si %dx %cx %r8 %r9
%ax %sp %ip, $stack0..$stack2, $stack, $retval, $comm or an immediate; anything that
dereferences memory (`+0(%di):string`, `@ADDR`, `@+OFF`, arrays, strings other than $comm) or
another register is refused with the reason, and the probe falls back to another engine.

Each argument becomes a Python expression over the record tuple `r`, the probe's `ip` and the
thread's `comm` (decode.py compiles them into one function per site, so a hit costs no call per
argument).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from probescope.engines.fentry.relocate import Refused
from probescope.language.model import (
    ArgType,
    Comm,
    FetchArg,
    Immediate,
    ImmediateString,
    Register,
    ReturnValue,
    StackEntry,
    StackPointer,
)

# positions in a record tuple (ring.RECORD)
R_TID, R_PID, R_TSC, R_CPU, R_AUX = 2, 3, 4, 5, 7
REGISTER_FIELDS = {"di": 8, "si": 9, "dx": 10, "cx": 11, "r8": 12, "r9": 13, "ax": 14, "sp": 15}
R_SP = 15
R_STACK0 = 16
STACK_WORDS = 3
_U64 = (1 << 64) - 1

Evaluate = Callable[[tuple[int, ...], int, Callable[[], str]], tuple[Any, ...]]


def convert_source(arg_type: ArgType, value: str) -> str:
    """The kernel's store of an unsigned long `value` into a fetcharg type, as an expression."""
    bits = arg_type.size * 8
    mask = (1 << bits) - 1
    if arg_type.bitfield is not None:
        width, offset, container = arg_type.bitfield
        left = container - width - offset
        right = container - width
        return f"((({value}) << {left}) & {(1 << container) - 1:#x}) >> {right}"
    if arg_type.signed:
        sign = 1 << (bits - 1)
        return f"((({value}) & {mask:#x}) ^ {sign:#x}) - {sign:#x}"
    if bits == 64:
        return f"({value})"  # record words are unsigned 64-bit already
    return f"(({value}) & {mask:#x})"


def arg_source(arg: FetchArg, is_return: bool, *, ip: str = "ip", comm: str = "comm") -> str:
    """The expression for one fetcharg over `r` (the record), and the expressions `ip` (the
    probe's address, or the return address) and `comm` (the thread's name)."""
    fetch = arg.fetch
    arg_type = arg.type
    where = f"{arg.name}={arg.expression}"
    if arg_type.count:
        raise Refused(f"{where}: an array reads memory, which a stub does not")
    if isinstance(fetch, Comm):
        if not arg_type.is_string:
            raise Refused(f"{where}: $comm needs a string type")
        return f"{comm}[:15]"
    if isinstance(fetch, ImmediateString):
        return "None"  # a fault, as uprobes on 6.18 read it (the ptrace engine agrees)
    if arg_type.is_string:
        raise Refused(f"{where}: a string reads memory, which a stub does not")
    if isinstance(fetch, Register):
        name = fetch.name
        if name == "ip":
            return convert_source(arg_type, ip)
        if name not in REGISTER_FIELDS:
            raise Refused(f"{where}: the stub records %di %si %dx %cx %r8 %r9 %ax %sp, not %{name}")
        return convert_source(arg_type, f"r[{REGISTER_FIELDS[name]}]")
    if isinstance(fetch, StackPointer):
        return convert_source(arg_type, f"r[{R_SP}]")
    if isinstance(fetch, StackEntry):
        if fetch.index >= STACK_WORDS:
            raise Refused(f"{where}: the stub records $stack0..$stack{STACK_WORDS - 1}")
        return convert_source(arg_type, f"r[{R_STACK0 + fetch.index}]")
    if isinstance(fetch, ReturnValue):
        if not is_return:
            raise Refused(f"{where}: $retval is only valid on return probes")
        return convert_source(arg_type, f"r[{REGISTER_FIELDS['ax']}]")
    if isinstance(fetch, Immediate):
        return convert_source(arg_type, f"{fetch.value & _U64:#x}")
    raise Refused(f"{where}: reads memory, which a stub does not (falls back)")


def args_source(
    args: Sequence[FetchArg], is_return: bool, *, ip: str = "ip", comm: str = "comm"
) -> str:
    """A tuple expression of every fetcharg (raises Refused for the first it cannot take)."""
    parts = [arg_source(arg, is_return, ip=ip, comm=comm) for arg in args]
    return "(" + "".join(f"{part}, " for part in parts) + ")"


def compile_args(args: Sequence[FetchArg], is_return: bool) -> Evaluate:
    """One function: (record, probe ip, comm getter) → the values in spec order."""
    source = args_source(args, is_return)
    needs_comm = "comm" in source
    body = f"lambda r, ip, comm_of: (lambda comm: {source})(comm_of() if {needs_comm} else '')"
    evaluate: Evaluate = eval(body)
    return evaluate
