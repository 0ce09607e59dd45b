"""`NAME=argN:gostring`: parsed as a string-typed AbiArgument, lowered in a Go function to a
GoString of the register pair (pointer argN, length argN+1), refused with a caret elsewhere."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError
from probescope.language.arch import ARM64, X86_64
from probescope.language.friendly import FriendlyProbe, lower_args
from probescope.language.go_strings import GOSTRING_TYPE, kernel_inexpressible
from probescope.language.model import AbiArgument, GoString, Register
from probescope.language.parse import parse_probe


def friendly(text: str) -> FriendlyProbe:
    spec = parse_probe(text, arch=X86_64)
    assert isinstance(spec, FriendlyProbe), spec
    return spec


def test_parsed_as_the_abi_argument_with_a_string_type() -> None:
    (arg,) = friendly("./srv:main.handle path=arg1:gostring").args
    assert arg.fetch == AbiArgument(1, "arg1")
    assert arg.type == GOSTRING_TYPE and arg.type.is_string
    assert str(arg.type) == "gostring" and arg.name == "path"


@pytest.mark.parametrize(
    ("number", "pointer", "length"), [(1, "ax", "bx"), (3, "cx", "di"), (8, "r10", "r11")]
)
def test_lowered_in_a_go_function_to_its_register_pair(
    number: int, pointer: str, length: str
) -> None:
    probe = friendly(f"./srv:main.handle s=arg{number}:gostring n=arg{number + 1}:u64")
    s, n = lower_args(probe, X86_64, on_entry=True, go_abi=True)
    assert s.fetch == GoString(Register(pointer), Register(length))
    assert s.type == GOSTRING_TYPE
    assert s.expression == f"arg{number}:gostring"  # no kernel line carries it
    assert n.fetch == Register(length)  # the length word itself stays readable
    assert kernel_inexpressible((s, n)) == [s]


def test_arm64_pairs_go_registers_too() -> None:
    probe = parse_probe("./srv:main.handle s=arg2:gostring", arch=ARM64)
    assert isinstance(probe, FriendlyProbe)
    (s,) = lower_args(probe, ARM64, on_entry=True, go_abi=True)
    assert s.fetch == GoString(Register("x1"), Register("x2"))


def _refused(text: str, *, go_abi: bool = True) -> SpecError:
    with pytest.raises(SpecError) as info:
        lower_args(friendly(text), X86_64, on_entry=True, go_abi=go_abi)
    return info.value


def test_a_c_function_is_refused_at_the_type() -> None:
    text = "c:puts s=arg1:gostring"
    error = _refused(text, go_abi=False)
    assert "Go's register ABI" in error.message
    assert error.column is not None and text[error.column :] == "gostring"
    assert "+0(argN):string" in (error.hint or "")


def test_the_length_must_be_in_a_register() -> None:
    text = "./srv:main.handle s=arg9:gostring"
    error = _refused(text)
    assert "needs arg10 for its length" in error.message
    assert error.column is not None and text[error.column :].startswith("arg9")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("./srv:main.handle s=+0(arg1):gostring", "'+0(arg1)' is not an argN"),
        ("./srv:main.handle s=%ax:gostring", "'%ax' is not an argN"),
        ("./srv:main.handle s=arg1:gostring[2]", "no array form"),
        ("p:g/e /bin/true:0x10 s=%ax:gostring", "friendly form's type"),
        ("k:vfs_read s=arg1:gostring", "friendly form's type"),
    ],
)
def test_refused_while_parsing_with_a_caret_at_the_type(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_probe(text, arch=X86_64)
    error = info.value
    assert message in error.message
    assert error.column is not None and text[error.column :].startswith("gostring")
    assert "argN:gostring" in (error.hint or "")


def test_not_in_a_return_probe() -> None:
    with pytest.raises(SpecError, match="not available in a return probe"):
        parse_probe("r:./srv:main.handle s=arg1:gostring", arch=X86_64)
