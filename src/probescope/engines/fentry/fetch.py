"""Fetchargs computed from a record, with the kernel's types; what a record cannot hold is refused.

A stub records the argument registers, %ax, %sp and the three words above %sp — no memory
reads (a fault inside a stub would kill the program, and the stub cannot recover the way the
kernel's copy_from_user does). So an argument is taken when it reads %di %si %dx %cx %r8 %r9
%ax %sp %ip, $stack0..$stack2, $stack, $retval, $comm or an immediate; anything that
dereferences memory (`+0(%di):string`, `@ADDR`, `@+OFF`, arrays, strings other than $comm) or
another register is refused with the reason, and the probe falls back to another engine.
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
_Value = Callable[[tuple[int, ...], int, Callable[[], str]], Any]


def convert(arg_type: ArgType) -> Callable[[int], int]:
    """The kernel's store of an unsigned long into a fetcharg type (size, sign, bitfield)."""
    bits = arg_type.size * 8
    mask = (1 << bits) - 1
    if arg_type.bitfield is not None:
        width, offset, container = arg_type.bitfield
        cmask = (1 << container) - 1
        left = container - width - offset
        right = container - width
        return lambda v: ((v << left) & cmask) >> right
    if arg_type.signed:
        sign = 1 << (bits - 1)
        return lambda v: ((v & mask) ^ sign) - sign
    return lambda v: v & mask


def compile_args(args: Sequence[FetchArg], is_return: bool) -> Evaluate:
    """One function: (record, probe ip, comm getter) → the values in spec order."""
    values = [_compile(arg, is_return) for arg in args]
    if not values:
        return lambda record, ip, comm: ()
    if len(values) == 1:
        only = values[0]
        return lambda record, ip, comm: (only(record, ip, comm),)
    return lambda record, ip, comm: tuple(value(record, ip, comm) for value in values)


def _compile(arg: FetchArg, is_return: bool) -> _Value:
    fetch = arg.fetch
    arg_type = arg.type
    where = f"{arg.name}={arg.expression}"
    if arg_type.count:
        raise Refused(f"{where}: an array reads memory, which a stub does not")
    if isinstance(fetch, Comm):
        if not arg_type.is_string:
            raise Refused(f"{where}: $comm needs a string type")
        return lambda record, ip, comm: (
            comm().encode("utf-8", "surrogateescape")[:15].decode("utf-8", "surrogateescape")
        )
    if isinstance(fetch, ImmediateString):
        return lambda record, ip, comm: None  # as uprobes on 6.18 (the ptrace engine agrees)
    if arg_type.is_string:
        raise Refused(f"{where}: a string reads memory, which a stub does not")
    to_type = convert(arg_type)
    if isinstance(fetch, Register):
        name = fetch.name
        if name == "ip":
            return lambda record, ip, comm: to_type(ip)
        if name not in REGISTER_FIELDS:
            raise Refused(f"{where}: the stub records %di %si %dx %cx %r8 %r9 %ax %sp, not %{name}")
        field = REGISTER_FIELDS[name]
        return lambda record, ip, comm: to_type(record[field])
    if isinstance(fetch, StackPointer):
        return lambda record, ip, comm: to_type(record[R_SP])
    if isinstance(fetch, StackEntry):
        if fetch.index >= STACK_WORDS:
            raise Refused(f"{where}: the stub records $stack0..$stack{STACK_WORDS - 1}")
        index = R_STACK0 + fetch.index
        return lambda record, ip, comm: to_type(record[index])
    if isinstance(fetch, ReturnValue):
        if not is_return:
            raise Refused(f"{where}: $retval is only valid on return probes")
        return lambda record, ip, comm: to_type(record[REGISTER_FIELDS["ax"]])
    if isinstance(fetch, Immediate):
        value = to_type(fetch.value & _U64)
        return lambda record, ip, comm: value
    raise Refused(f"{where}: reads memory, which a stub does not (falls back)")
