"""Lowering: the friendly form's `argN` and `retval` rewritten into the kernel's fetches.

A pure rewrite of the parsed arguments, once the probe's place is known: on a uprobe `argN`
becomes the ABI register (or `$stackK` past the register arguments, at a function's first
instruction only; in a Go function Go's register ABI, where `argN` is the Nth register word
and a string takes two: pointer, length, so `argN:gostring` becomes a `GoString` of both), on
a kprobe `$argN`; `retval` becomes `$retval` on both. The expression written to the kernel
is printed from the lowered node, spliced where the user wrote `argN`, so the rest keeps the
user's own spelling (`+0x10(...)`, `\\0x7b`) and the kernel echoes what the user wrote.
Errors point at the user's text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from probescope.errors import SpecError
from probescope.language.arch import Arch
from probescope.language.fetchargs import MAX_ARGSTR_LEN
from probescope.language.go_strings import is_gostring
from probescope.language.kernel_numbers import ULONG_MAX
from probescope.language.model import (
    AbiArgument,
    Dereference,
    Fetch,
    FetchArg,
    FriendlyReturnValue,
    FunctionArg,
    GoString,
    Register,
    ReturnValue,
    StackEntry,
    innermost,
)


@dataclass(frozen=True)
class Place:
    """What lowering needs to know about where a probe sits."""

    arch: Arch
    user: bool = True  # a uprobe (ABI registers and stack) rather than a kprobe ($argN)
    on_entry: bool = True  # at a function's first instruction: stack arguments readable
    go_abi: bool = False  # a Go function taking Go's register ABI (symbols/golang.py)


def lower_fetchargs(args: tuple[FetchArg, ...], place: Place, *, spec: str) -> tuple[FetchArg, ...]:
    """Every argument with its friendly variable (if any) lowered for `place`; `spec` is the
    text the arguments were parsed from, for error carets."""
    return tuple(lower_fetcharg(arg, place, spec=spec) for arg in args)


def lower_fetcharg(arg: FetchArg, place: Place, *, spec: str) -> FetchArg:
    """One argument lowered; an argument without `argN`/`retval` is returned as it is."""
    variable = innermost(arg.fetch)
    if is_gostring(arg.type) and isinstance(variable, AbiArgument):
        return replace(arg, fetch=_lower_go_string(arg, variable, place, spec))
    if not isinstance(variable, AbiArgument | FriendlyReturnValue):
        return arg
    lowered = _lower_variable(variable, place, spec)
    # `$argN` keeps the user's digits (`arg010` is `$arg010`, decimal to the kernel too).
    text = f"${variable.spelling}" if isinstance(lowered, FunctionArg) else str(lowered)
    start = variable.column - (arg.column or 0)
    expression = arg.expression[:start] + text + arg.expression[start + len(variable.spelling) :]
    if len(expression) > MAX_ARGSTR_LEN:
        raise SpecError(
            f"argument expression is too long once lowered: {expression!r} has "
            f"{len(expression)} characters, the kernel takes at most {MAX_ARGSTR_LEN}",
            spec=spec,
            column=arg.column,
            hint=f"{variable.spelling} becomes {text} here",
        )
    return replace(arg, fetch=_replace_innermost(arg.fetch, lowered), expression=expression)


def _lower_go_string(arg: FetchArg, variable: AbiArgument, place: Place, spec: str) -> GoString:
    """`argN:gostring`: Go's register ABI passes the pointer in argN, the length in the next
    word. The expression keeps the user's text: no kernel line can carry it."""
    if not (place.user and place.go_abi):
        type_column = (arg.column or 0) + arg.expression.rfind(":") + 1
        raise SpecError(
            "gostring reads a string passed by Go's register ABI (pointer in argN, length in "
            "arg(N+1)); this function does not take Go's register ABI",
            spec=spec,
            column=type_column,
            hint="probe a function of a Go binary (Go 1.17 or later on amd64, 1.18 on arm64); "
            "a C string is +0(argN):string",
        )
    number = variable.number
    pointer = place.arch.arg_register(number, go=True)
    length = place.arch.arg_register(number + 1, go=True)
    if pointer is None or length is None:
        registers = len(place.arch.go_arg_registers)
        raise SpecError(
            f"a Go string in arg{number} needs arg{number + 1} for its length; Go passes only "
            f"{registers} words in registers, the rest on the stack in a layout only the "
            "parameters' types tell",
            spec=spec,
            column=variable.column,
            hint=f"a string's pointer is at most arg{registers - 1}",
        )
    return GoString(Register(pointer), Register(length))


def _lower_variable(variable: AbiArgument | FriendlyReturnValue, place: Place, spec: str) -> Fetch:
    if isinstance(variable, FriendlyReturnValue):
        return ReturnValue()
    number = variable.number
    if not place.user:
        return FunctionArg(number)
    arch = place.arch
    register = arch.arg_register(number, go=place.go_abi)
    if register is not None:
        return Register(register)
    if place.go_abi:
        raise SpecError(
            f"arg{number} of a Go function: Go passes the words past its "
            f"{len(arch.go_arg_registers)} argument registers on the stack, in a layout only "
            "the parameters' types tell",
            spec=spec,
            column=variable.column,
            hint="read them from the stack yourself, e.g. +8(%sp) at the first instruction",
        )
    if not place.on_entry:
        raise SpecError(
            f"arg{number} is passed on the stack and can only be read at the function's "
            "first instruction",
            spec=spec,
            column=variable.column,
            hint=f"the first {len(arch.arg_registers)} arguments are in registers anywhere "
            "in the function",
        )
    # At entry x86_64 has the return address at $stack0; arm64 keeps it in lr.
    slot = number - len(arch.arg_registers) - (0 if arch.name == "x86_64" else 1)
    if slot > ULONG_MAX:
        raise SpecError(
            f"invalid argument number in {variable.spelling!r}", spec=spec, column=variable.column
        )
    return StackEntry(slot)


def _replace_innermost(fetch: Fetch, leaf: Fetch) -> Fetch:
    if isinstance(fetch, Dereference):
        return replace(fetch, base=_replace_innermost(fetch.base, leaf))
    return leaf
