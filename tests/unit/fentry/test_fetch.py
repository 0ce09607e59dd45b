"""Fetchargs from a record: the registers, stack words and return value a stub records, with the
kernel's types; anything needing memory reads is refused (the probe falls back)."""

from __future__ import annotations

import pytest

from probescope.engines.fentry.fetch import compile_args
from probescope.engines.fentry.relocate import Refused
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeSpec

# commit site tid pid tsc cpu reserved aux | rdi rsi rdx rcx r8 r9 rax rsp stack0..2
RECORD = (1, 0, 11, 10, 0, 0, 0, 0x4000,
          0xFFFFFFFFFFFFFFFF, 2, 3, 4, 5, 6, 0x1234, 0x7FFC00, 0x4010, 0x42, 0x43)  # fmt: skip


def evaluate(args: str, kind: str = "p") -> tuple[object, ...]:
    spec = parse_kernel_probe(f"{kind}:g/e /bin/true:0x10 {args}")
    assert isinstance(spec, ProbeSpec)
    return compile_args(spec.args, kind == "r")(RECORD, 0x5000, lambda: "prog")


def test_registers_and_types() -> None:
    assert evaluate("a=%di:s64 b=%di:u8 c=%si d=%r9:x16 e=%ax:s16") == (-1, 255, 2, 6, 0x1234)


def test_stack_words_ip_and_comm() -> None:
    assert evaluate("s=$stack0 t=$stack2 sp=$stack ip=%ip c=$comm") == (
        0x4010, 0x43, 0x7FFC00, 0x5000, "prog",
    )  # fmt: skip


def test_return_value() -> None:
    assert evaluate("r=$retval:s32", "r") == (0x1234,)
    assert evaluate("r=$retval:s8 ip=%ip", "r") == (0x34, 0x5000)


def test_bitfields_as_the_kernel_stores_them() -> None:
    assert evaluate("b=%ax:b4@4/16") == (0x3,)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ("s=+0(%di):string", "a string reads memory"),
        ("x=+8(%si):u64", "reads memory"),
        ("a=%bx", "not %bx"),
        ("s=$stack3", r"\$stack0..\$stack2"),
        ("v=@0x1000:u32", "reads memory"),
    ],
)
def test_what_a_record_cannot_hold_is_refused(args: str, why: str) -> None:
    with pytest.raises(Refused, match=why):
        evaluate(args)
