"""Go strings (`NAME=argN:gostring`): the type, and where the probe language takes it.

Go's register ABI passes a string as two words, its pointer in argument N and its length in
argument N+1, with no NUL after the bytes (a substring points into the middle of another).
The friendly form's `argN:gostring` names that pair; lowering (lowering.py) turns it into a
`GoString` of two registers. An event holds it as a string field, exactly pointer[0:length].
"""

from __future__ import annotations

from collections.abc import Sequence

from probescope.language.model import AbiArgument, ArgType, Fetch, FetchArg

GOSTRING = "gostring"
GOSTRING_TYPE = ArgType(name=GOSTRING, base="string", size=4, signed=False)
"""The argument's type: recorded as the kernel records a string (a `__data_loc char[]`)."""


def is_gostring(arg_type: ArgType) -> bool:
    return arg_type.name == GOSTRING


def gostring_problem(
    fetch: Fetch, fetch_text: str, *, friendly: bool, user: bool, count: int
) -> tuple[str, str] | None:
    """Why `fetch_text:gostring` cannot be an argument here, as (message, hint); None when it
    can (whether the function is Go's is known only once it is looked up: lowering checks)."""
    usage = "write NAME=argN:gostring on a Go function: argN is the pointer, arg(N+1) the length"
    if not (friendly and user):
        return (
            "gostring is the friendly form's type for a Go function's string argument; the "
            "kernel's fetch arguments cannot read a string bounded by a length",
            usage + " (e.g. ./server:main.handle path=arg1:gostring)",
        )
    if count:
        return "a Go string has no array form", usage
    if not isinstance(fetch, AbiArgument):
        return (
            f"gostring reads the string a Go function's argN holds (its pointer in argN, its "
            f"length in arg(N+1)); {fetch_text!r} is not an argN",
            usage + "; for a string in memory use +0(...):string",
        )
    return None


KERNEL_CANNOT = (
    "uprobe_events reads a string up to its NUL and cannot bound a read by a length, as a Go "
    "string needs"
)
"""Why no `uprobe_events` line carries a Go string (the tracefs engine refuses it)."""


def kernel_inexpressible(args: Sequence[FetchArg]) -> list[FetchArg]:
    """The arguments no `uprobe_events` line can carry: only engines that read memory
    themselves (bpf, ptrace) fetch them."""
    return [arg for arg in args if is_gostring(arg.type)]
