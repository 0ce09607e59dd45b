"""SDT argument strings → kernel fetchargs, one operand form at a time (pure, no files)."""

from __future__ import annotations

import pytest

from probescope.language.x86_64_registers import ASSEMBLER_NAMES
from probescope.symbols.elfimage import EM_386, EM_AARCH64, EM_X86_64
from probescope.symbols.usdt_arguments import (
    SdtOperand,
    SiteContext,
    UsdtArg,
    fetch_type,
    parse_arguments,
)

PC = 0x1190
SYMBOLS = {"g_int": 0x4010, "g_pt": 0x4020, "ps_counter.0": 0x4100}


def context(machine: int = EM_X86_64, *, pie: bool = True, is_64bit: bool = True) -> SiteContext:
    return SiteContext(
        machine=machine,
        is_64bit=is_64bit,
        pc=PC,
        position_independent=pie,
        symbol_address=SYMBOLS.get,
    )


def one(text: str, **kwargs: object) -> UsdtArg:
    (arg,) = parse_arguments(text, context(**kwargs))  # type: ignore[arg-type]
    return arg


@pytest.mark.parametrize(
    "text, fetcharg",
    [
        # registers in every width alias; the SIZE before @ sets the type
        ("-4@%edi", "%di:s32"),
        ("8@%rdi", "%di:u64"),
        ("-2@%di", "%di:s16"),
        ("-1@%dil", "%di:s8"),
        ("1@%al", "%ax:u8"),
        ("-8@%rax", "%ax:s64"),
        ("-2@%cx", "%cx:s16"),
        ("-1@%sil", "%si:s8"),
        ("4@%ebp", "%bp:u32"),
        ("1@%bpl", "%bp:u8"),
        ("8@%rsp", "%sp:u64"),
        ("1@%spl", "%sp:u8"),
        ("-8@%r8", "%r8:s64"),
        ("4@%r9d", "%r9:u32"),
        ("-2@%r10w", "%r10:s16"),
        ("1@%r11b", "%r11:u8"),
        ("1@%r15l", "%r15:u8"),
        # a narrower alias than SIZE: the SIZE governs (sdt.h, gdb PR24541)
        ("8@%edi", "%di:u64"),
        ("-4@%ax", "%ax:s32"),
        # immediates; gcc prints unsigned constants as signed ones
        ("-4@$5", "\\5:s32"),
        ("-4@$-5", "\\-5:s32"),
        ("1@$-56", "\\-56:u8"),
        ("-8@$123456789012", "\\123456789012:s64"),
        ("8@$0x10", "\\16:u64"),
        # memory through a base register
        ("-4@-1204(%rbp)", "-1204(%bp):s32"),
        ("8@(%rax)", "+0(%ax):u64"),
        ("-8@16(%rdx)", "+16(%dx):s64"),
        ("-1@0(%rbp)", "+0(%bp):s8"),
        ("-4@112(%rsp)", "+112(%sp):s32"),
        ("8@0x10(%r12)", "+16(%r12):u64"),
        # %rip-relative and absolute symbolic operands: ±(symbol − probe address)(%ip)
        ("-4@g_int(%rip)", f"+{0x4010 - PC}(%ip):s32"),
        ("-8@8+g_pt(%rip)", f"+{0x4028 - PC}(%ip):s64"),
        ("-8@g_pt+8(%rip)", f"+{0x4028 - PC}(%ip):s64"),
        ("-8@g_pt-8(%rip)", f"+{0x4018 - PC}(%ip):s64"),
        ("4@ps_counter.0(%rip)", f"+{0x4100 - PC}(%ip):u32"),
        ("-4@g_int", f"+{0x4010 - PC}(%ip):s32"),
        # floating point in a general register or memory: raw bits
        ("8f@%rsi", "%si:x64"),
        ("4f@%edi", "%di:x32"),
        ("8f@-40(%rbp)", "-40(%bp):x64"),
        ("-8f@-40(%rbp)", "-40(%bp):x64"),
    ],
)
def test_x86_64_operands(text: str, fetcharg: str) -> None:
    arg = one(text)
    assert (arg.fetcharg, arg.problem) == (fetcharg, None)
    assert arg.text == text
    assert arg.definition == f"arg1={fetcharg}"


def test_symbol_below_the_probe_gives_a_negative_displacement() -> None:
    arg = parse_arguments(
        "-4@g_int(%rip)",
        SiteContext(EM_X86_64, True, 0x5000, True, SYMBOLS.get),
    )[0]
    assert arg.fetcharg == f"-{0x5000 - 0x4010}(%ip):s32"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("-8@(%rdx,%rsi,8)", "base+index*scale addressing has no fetcharg form"),
        ("-1@(%r8,%rdi)", "base+index*scale addressing has no fetcharg form"),
        ("8@16(,%rax,8)", "base+index*scale addressing has no fetcharg form"),
        ("8f@%xmm0", "floating-point/vector register %xmm0 cannot be fetched by a uprobe"),
        ("8@%fs:0x28", "segment-relative address (%fs:) cannot be fetched by a uprobe"),
        ("8@%fs:(%rax)", "segment-relative address (%fs:) cannot be fetched by a uprobe"),
        ("1@%ah", "%ah is bits 8-15 of %ax, which a fetcharg cannot shift out"),
        ("16@%rax", "a 16-byte value has no fetch type (the kernel's are 1, 2, 4 or 8 bytes)"),
        ("3@%rax", "a 3-byte value has no fetch type (the kernel's are 1, 2, 4 or 8 bytes)"),
        ("8@%rzz", "unknown register %rzz"),
        ("8@%rip", "the instruction pointer is not a value of the program"),
        ("8@8(%rip)", "a numeric %rip displacement has no meaning at a probe site"),
        ("8@missing(%rip)", "symbol missing is not in the file's symbol tables"),
        ("8@(%rax", "not an operand form sdt.h emits"),
        ("8@(%rax,%rbx,3)", "scale 3 is not 1, 2, 4 or 8"),
        ("8@g_int-g_pt(%rip)", "the expression 'g_int-g_pt' combines symbols"),
        ("8@", "the operand is missing"),
        # the address of a symbol, or an absolute address, in a position-independent file
        ("8@$g_int", "the address of g_int depends on where the file is loaded"),
        ("4@0x601040", "an absolute address in a position-independent file has no fixed location"),
        ("4@g_int(%rax)", "g_int's address depends on where the file is loaded"),
    ],
)
def test_x86_64_refusals_name_the_argument_and_the_reason(text: str, reason: str) -> None:
    arg = one(text)
    assert arg.fetcharg is None and arg.definition is None
    assert arg.problem is not None
    assert arg.problem.startswith(f"argument 1 ({text!r}): {reason}")


@pytest.mark.parametrize(
    "text, fetcharg",
    [
        ("8@$g_int", f"\\{0x4010:#x}:u64"),
        ("8@$g_pt+8", f"\\{0x4028:#x}:u64"),
        ("4@0x601040", "@0x601040:u32"),
        ("-4@g_int(%rax)", f"+{0x4010}(%ax):s32"),
        ("-4@g_int", f"+{0x4010 - PC}(%ip):s32"),
    ],
)
def test_et_exec_knows_absolute_addresses(text: str, fetcharg: str) -> None:
    assert one(text, pie=False).fetcharg == fetcharg


def test_several_arguments_keep_their_order_and_numbers() -> None:
    args = parse_arguments("-4@-1204(%rbp) -4@%edi -8@%r8 -4@$5 8@%rdx -2@%cx -1@%sil", context())
    assert [a.definition for a in args] == [
        "arg1=-1204(%bp):s32",
        "arg2=%di:s32",
        "arg3=%r8:s64",
        "arg4=\\5:s32",
        "arg5=%dx:u64",
        "arg6=%cx:s16",
        "arg7=%si:s8",
    ]
    assert [a.index for a in args] == list(range(1, 8))


def test_a_refused_argument_does_not_hide_the_others() -> None:
    args = parse_arguments("8@(%rbx,%rcx,8) 8f@%xmm0 -4@%eax", context())
    assert [a.fetcharg for a in args] == [None, None, "%ax:s32"]
    assert args[1].problem is not None and args[1].problem.startswith("argument 2 ('8f@%xmm0')")


def test_empty_and_blank_argument_strings_have_no_arguments() -> None:
    assert parse_arguments("", context()) == ()
    assert parse_arguments("   ", context()) == ()


def test_bare_operands_of_old_sdt_h_are_read_as_long() -> None:
    args = parse_arguments("%rdi -8(%rbp)", context())
    assert [(a.size, a.signed, a.fetcharg) for a in args] == [
        (8, True, "%di:s64"),
        (8, True, "-8(%bp):s64"),
    ]


def test_float_arguments_carry_a_note() -> None:
    arg = one("8f@%rsi")
    assert arg.is_float and arg.type_name == "x64"
    assert arg.note == "floating-point value: fetched as its raw bits"
    assert one("-4@%edi").note is None


def test_structured_operands_for_engines_that_evaluate_them() -> None:
    assert one("-8@(%rdx,%rsi,8)").operand == SdtOperand(
        "memory", register="dx", index="si", scale=8
    )
    assert one("-4@%edi").operand == SdtOperand("register", register="di")
    assert one("-4@$-5").operand == SdtOperand("immediate", displacement=-5)
    assert one("-8@8+g_pt(%rip)").operand == SdtOperand(
        "memory", register="ip", displacement=8, symbol="g_pt"
    )


# ---- i386 ---------------------------------------------------------------------------------


def test_i386_register_pairs_are_refused_and_memory_is_not() -> None:
    args = parse_arguments("-4@%ecx -8@%eax -8@(%esp) -2@14(%esp)", context(EM_386, is_64bit=False))
    assert [a.fetcharg for a in args] == ["%cx:s32", None, "+0(%sp):s64", "+14(%sp):s16"]
    assert args[1].problem == (
        "argument 2 ('-8@%eax'): an 8-byte value named by the 4-byte register %eax "
        "spans a register pair"
    )


def test_i386_has_no_64_bit_registers() -> None:
    arg = one("8@%r8", machine=EM_386, is_64bit=False)
    assert arg.problem is not None and "unknown register %r8" in arg.problem


def test_bare_operands_in_elfclass32_are_four_bytes() -> None:
    args = parse_arguments("%eax", context(EM_386, is_64bit=False))
    assert (args[0].size, args[0].fetcharg) == (4, "%ax:s32")


# ---- aarch64 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, fetcharg",
    [
        ("-8@x4", "%x4:s64"),
        ("-4@w1", "%x1:s32"),
        ("8@x30", "%x30:u64"),
        ("8@lr", "%x30:u64"),
        ("8@sp", "%sp:u64"),
        ("-4@[sp, 96]", "+96(%sp):s32"),
        ("-4@[sp,96]", "+96(%sp):s32"),
        ("8@[x0]", "+0(%x0):u64"),
        ("-8@[x29, -16]", "-16(%x29):s64"),
        ("4@[x1, #8]", "+8(%x1):u32"),
        ("-4@5", "\\5:s32"),
        ("-4@-3", "\\-3:s32"),
        ("8@xzr", "\\0:u64"),
    ],
)
def test_aarch64_operands(text: str, fetcharg: str) -> None:
    arg = one(text, machine=EM_AARCH64)
    assert (arg.fetcharg, arg.problem) == (fetcharg, None)


def test_aarch64_operands_with_spaces_split_correctly() -> None:
    args = parse_arguments("-4@[sp, 96] 8@x0 -8@[x1, -8] 4@7", context(EM_AARCH64))
    assert [a.fetcharg for a in args] == ["+96(%sp):s32", "%x0:u64", "-8(%x1):s64", "\\7:u32"]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("8@d0", "floating-point/vector register d0 cannot be fetched by a uprobe"),
        ("8@[x0, x1]", "register-offset addressing ([x0, x1]) has no fetcharg form"),
        ("8@x31", "unknown register x31"),
    ],
)
def test_aarch64_refusals(text: str, reason: str) -> None:
    problem = one(text, machine=EM_AARCH64).problem
    assert problem is not None and problem.endswith(reason)


def test_unsupported_machines_say_so() -> None:
    problem = one("-4@%r1", machine=20).problem  # EM_PPC
    assert problem == "argument 1 ('-4@%r1'): operands of machine 20 binaries are not supported"


# ---- types and re-typing --------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, signed, is_float, expected",
    [
        (1, True, False, "s8"),
        (2, False, False, "u16"),
        (4, True, True, "x32"),
        (8, False, False, "u64"),
    ],
)
def test_fetch_types(size: int, signed: bool, is_float: bool, expected: str) -> None:
    assert fetch_type(size, signed, is_float) == expected


@pytest.mark.parametrize(
    "text, type_name, expected",
    [
        ("8@%rbp", "string", "+0(%bp):string"),
        ("8@-8(%rbp)", "string", "+0(-8(%bp)):string"),
        ("8@g_pt(%rip)", "ustring", f"+0(+{0x4020 - PC}(%ip)):ustring"),
        ("8@%rbp", "x64", "%bp:x64"),
        ("-4@-4(%rbp)", "u8", "-4(%bp):u8"),
        ("8@$16", "string", "@0x10:string"),
        ("-8@$-1", "string", None),
        ("8f@%xmm0", "string", None),
    ],
)
def test_fetch_as_another_type(text: str, type_name: str, expected: str | None) -> None:
    assert one(text).fetch_as(type_name) == expected


def test_every_x86_alias_maps_to_a_kernel_register_name() -> None:
    from probescope.language.arch import X86_64

    assert {kernel for kernel, _ in ASSEMBLER_NAMES.values()} <= X86_64.registers
