"""The friendly form: parsing, lowering of argN/retval, event names, and errors with carets."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import ARM64, X86_64
from probescope.language.event_names import MAX_EVENT_LEN, event_name_for, first_free, numbered
from probescope.language.friendly import FriendlyProbe, lower_args, split_target
from probescope.language.model import (
    AbiArgument,
    Dereference,
    FriendlyReturnValue,
    FunctionArg,
    ProbeKind,
    ProbeSpec,
    Register,
    ReturnValue,
    StackEntry,
)
from probescope.language.parse import parse_probe
from probescope.language.usdt_spec import UsdtSpec


def friendly(text: str) -> FriendlyProbe:
    spec = parse_probe(text, arch=X86_64)
    assert isinstance(spec, FriendlyProbe), spec
    return spec


@pytest.mark.parametrize(
    ("text", "target", "symbol", "offset", "kind"),
    [
        ("bash:readline", "bash", "readline", 0, ProbeKind.UPROBE),
        ("r:bash:readline", "bash", "readline", 0, ProbeKind.URETPROBE),
        ("bash:readline%return", "bash", "readline", 0, ProbeKind.URETPROBE),
        ("ur:c:malloc", "c", "malloc", 0, ProbeKind.URETPROBE),
        ("uprobe:c:malloc", "c", "malloc", 0, ProbeKind.UPROBE),
        (
            "/usr/lib/x86_64-linux-gnu/libc.so.6:malloc",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "malloc",
            0,
            ProbeKind.UPROBE,
        ),
        ("./prog:main+4", "./prog", "main", 4, ProbeKind.UPROBE),
        ("./prog:main+0x10", "./prog", "main", 16, ProbeKind.UPROBE),
        ("bash:0x4245c0", "bash", None, 0x4245C0, ProbeKind.UPROBE),
        ("c:str*", "c", "str*", 0, ProbeKind.UPROBE),
        ("c:malloc@@GLIBC_2.2.5", "c", "malloc@@GLIBC_2.2.5", 0, ProbeKind.UPROBE),
        ("/weird:dir/prog:main", "/weird:dir/prog", "main", 0, ProbeKind.UPROBE),
    ],
)
def test_locations(
    text: str, target: str, symbol: str | None, offset: int, kind: ProbeKind
) -> None:
    probe = friendly(text)
    assert (probe.target, probe.symbol, probe.offset, probe.kind) == (target, symbol, offset, kind)


def test_kernel_head_with_friendly_location() -> None:
    probe = friendly("p:mygrp/myev ./prog:main x=arg1")
    assert (probe.group, probe.event, probe.symbol) == ("mygrp", "myev", "main")
    probe = friendly("r:ev bash:readline retval")
    assert (probe.group, probe.event, probe.kind) == (None, "ev", ProbeKind.URETPROBE)


def test_kernel_grammar_still_wins_for_numeric_locations() -> None:
    spec = parse_probe("p:ev /bin/bash:0x10 %di", arch=X86_64)
    assert isinstance(spec, ProbeSpec)


def test_glob_detection() -> None:
    assert friendly("c:str*").is_glob
    assert friendly("c:mem[cs]*").is_glob
    assert not friendly("c:malloc").is_glob


def test_split_target_uses_first_colon_after_last_slash() -> None:
    assert split_target("a/b:c/d:sym") == ("a/b:c/d", "sym")
    assert split_target("c:malloc") == ("c", "malloc")
    assert split_target("nocolon") is None


def test_lowering_arguments_x86_64() -> None:
    probe = friendly("c:memcpy dst=arg1 arg2 n=arg3:u64 +0(arg2):string arg7 $arg8")
    args = lower_args(probe, X86_64, on_entry=True)
    assert [str(a) for a in args] == [
        "dst=%di",
        "arg2=%si",
        "n=%dx:u64",
        "arg4=+0(%si):string",
        "arg7=$stack1",
        "arg8=$stack2",
    ]
    assert args[0].fetch == Register("di")
    assert args[4].fetch == StackEntry(1)


def test_lowering_arguments_arm64() -> None:
    probe = parse_probe("c:memcpy arg1 arg9 n=arg3:u64", arch=ARM64)
    assert isinstance(probe, FriendlyProbe)
    args = lower_args(probe, ARM64, on_entry=True)
    assert [str(a) for a in args] == ["arg1=%x0", "arg9=$stack0", "n=%x2:u64"]


def test_retval_in_return_probe() -> None:
    probe = friendly("r:bash:readline retval line=+0(retval):string $retval:s32")
    args = lower_args(probe, X86_64, on_entry=True)
    assert [str(a) for a in args] == [
        "retval=$retval",
        "line=+0($retval):string",
        "arg3=$retval:s32",
    ]
    assert args[0].fetch == ReturnValue()


def test_names_inside_immediate_strings_are_left_alone() -> None:
    probe = friendly('c:puts s=\\"arg1"')
    (arg,) = lower_args(probe, X86_64, on_entry=True)
    assert str(arg) == 's=\\"arg1"'


@pytest.mark.parametrize(
    ("text", "message", "caret_at"),
    [
        ("bash:readline retval", "only available in a return probe", "retval"),
        ("r:bash:readline arg1", "not available in a return probe", "arg1"),
        ("bash:readline x=arg0", "count from arg1", "arg0"),
    ],
)
def test_argument_errors_point_at_the_argument(text: str, message: str, caret_at: str) -> None:
    """Found while parsing now (the probe's kind is known then), before anything is located."""
    with pytest.raises(SpecError, match=message) as info:
        lower_args(friendly(text), X86_64, on_entry=True)
    assert info.value.column is not None
    assert text[info.value.column :].startswith(caret_at)


def test_stack_args_need_function_entry() -> None:
    probe = friendly("./prog:main+4 arg7")
    with pytest.raises(SpecError, match="stack"):
        lower_args(probe, X86_64, on_entry=False)


@pytest.mark.parametrize(
    ("text", "message", "caret_at"),
    [
        ("bash:", "missing symbol", ""),
        ("bash:readline%ret", "invalid suffix", "%ret"),
        ("bash:readline+zz", "invalid offset", "zz"),
        ("r:bash:readline+4", "first instruction", "readline"),
        ("bash:12zz", "invalid offset", "12zz"),
    ],
)
def test_location_errors(text: str, message: str, caret_at: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_probe(text, arch=X86_64)
    assert info.value.column is not None
    assert text[info.value.column :].startswith(caret_at)
    assert "^" in info.value.render()


def test_event_names_for_symbols() -> None:
    assert event_name_for("readline", 0, False) == "readline"
    assert event_name_for("readline", 0, True) == "readline__return"
    assert event_name_for("malloc@@GLIBC_2.2.5", 0, False) == "malloc"
    assert event_name_for("main", 4, False) == "main_4"
    assert event_name_for("_ZN3foo3barEv", 0, False) == "_ZN3foo3barEv"
    assert event_name_for("operator.new", 0, False) == "operator_new"
    assert event_name_for("9lives", 0, False) == "_9lives"
    long = event_name_for("x" * 100, 0, True)
    assert len(long) == 63 and long.endswith("__return")


def test_friendly_kprobes_lower_to_kernel_grammar() -> None:
    spec = parse_probe("k:do_sys_openat2 dfd=arg1 arg2:u32", arch=X86_64)
    assert isinstance(spec, ProbeSpec)
    assert spec.kind is ProbeKind.KPROBE
    assert str(spec) == "p:kprobes/p_do_sys_openat2_0 do_sys_openat2 dfd=$arg1 arg2=$arg2:u32"
    spec = parse_probe("kr:vfs_read retval:s64", arch=X86_64)
    assert isinstance(spec, ProbeSpec)
    assert str(spec) == "r:kprobes/r_vfs_read_0 vfs_read retval=$retval:s64"


def caret_under(text: str, error: SpecError) -> str:
    assert error.spec == text
    assert error.column is not None
    return text[error.column :]


def test_a_type_error_points_at_the_type_the_user_typed() -> None:
    text = "c:malloc size=arg1:u65"
    with pytest.raises(SpecError, match="unknown type 'u65'") as info:
        parse_probe(text, arch=X86_64)
    assert caret_under(text, info.value) == "u65"
    assert "%di" not in info.value.render()


@pytest.mark.parametrize(
    ("text", "caret_at"),
    [
        ("c:malloc size=(arg1", "(arg1"),
        ("c:malloc size=+8(arg1:string", ":string"),
        ("c:malloc x=+u8(%rax)", "%rax"),
        ("c:malloc x=-u8(+0(%rax))", "%rax"),
        ("c:malloc x=arg1:string", "string"),
        ("r:c:malloc x=+0(arg1)", "arg1"),
        ("c:malloc x=+0(retval)", "retval"),
        ("c:malloc arg1x", "arg1x"),
    ],
)
def test_argument_errors_are_found_while_parsing(text: str, caret_at: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_probe(text, arch=X86_64)
    assert caret_under(text, info.value).startswith(caret_at)


def test_every_bad_argument_of_a_probe_is_reported() -> None:
    text = "c:malloc a=(arg1 b=arg2 c=arg3:u65"
    with pytest.raises(SpecErrors) as info:
        parse_probe(text, arch=X86_64)
    assert [caret_under(text, e) for e in info.value.errors] == ["(arg1 b=arg2 c=arg3:u65", "u65"]


def test_argument_errors_can_be_collected_with_the_location() -> None:
    """The caller still gets the probe, to check its target: collect, then fail."""
    text = "nosuchlib:malloc size=(arg1 ok=arg2"
    problems: list[SpecError] = []
    probe = parse_probe(text, arch=X86_64, diagnostics=problems)
    assert isinstance(probe, FriendlyProbe)
    assert (probe.target, probe.symbol) == ("nosuchlib", "malloc")
    assert [a.name for a in probe.args] == ["ok"]
    assert [caret_under(text, e) for e in problems] == ["(arg1 ok=arg2"]


def test_friendly_variables_are_nodes_that_keep_their_columns() -> None:
    text = "c:memcpy dst=+8(arg1) $arg7 r=arg2:u32"
    probe = friendly(text)
    first, second, third = probe.args
    assert first.fetch == Dereference(8, AbiArgument(1, "arg1"))
    assert isinstance(first.fetch, Dereference)
    assert isinstance(first.fetch.base, AbiArgument)
    assert text[first.fetch.base.column :].startswith("arg1)")
    assert (second.name, second.fetch) == ("arg7", AbiArgument(7, "$arg7"))
    assert (first.column, third.column) == (text.index("+8"), text.index("arg2"))
    (ret,) = friendly("r:c:malloc retval").args
    assert (ret.name, ret.fetch) == ("retval", FriendlyReturnValue("retval"))


def test_lowering_keeps_the_users_spelling_around_the_variable() -> None:
    probe = friendly("c:f x=+0x10(arg2):u32 y=-010(+u0(arg8)):x8 z=\\0x7b")
    assert [str(a) for a in lower_args(probe, X86_64, on_entry=True)] == [
        "x=+0x10(%si):u32",
        "y=-010(+u0($stack2)):x8",
        "z=\\0x7b",
    ]


def test_a_stack_argument_inside_a_function_points_at_it() -> None:
    text = "./prog:main+4 x=+8(arg9):u32"
    probe = friendly(text)
    with pytest.raises(SpecError, match="arg9 is passed on the stack") as info:
        lower_args(probe, X86_64, on_entry=False)
    assert caret_under(text, info.value) == "arg9):u32"
    assert [str(a) for a in lower_args(probe, X86_64, on_entry=True)] == ["x=+8($stack3):u32"]


def test_the_kernels_limit_applies_to_the_lowered_expression() -> None:
    fits = "+" + "0" * 55 + "(arg1)"  # 62 characters, 61 once lowered (+0...0(%di))
    assert len(lower_args(friendly(f"c:f {fits}"), X86_64, on_entry=True)) == 1
    text = "c:f x=+" + "0" * 54 + "(arg7)"  # 61 characters, 64 once lowered (+0...0($stack1))
    with pytest.raises(SpecError, match="too long once lowered") as info:
        lower_args(friendly(text), X86_64, on_entry=True)
    assert caret_under(text, info.value).startswith("+000")
    with pytest.raises(SpecError, match="too long"):
        friendly("c:f x=+" + "0" * 62 + "(%di)")  # no friendly variable: refused at once


@pytest.mark.parametrize(
    ("text", "message", "caret_at"),
    [
        ("k:vfs_read+4 arg1", "only on function entry or exit", "arg1"),
        ("k:vfs_read retval", "only available in a return probe", "retval"),
        ("k:vfs_read x=arg1:u65", "unknown type", "u65"),
        ("k:vfs_read x=+0(%rax)", "invalid register", "%rax"),
        ("kr:vfs_read+4 retval", "return probe must be on a function entry", "vfs_read+4"),
        ("k:/x:y", "not a kprobe location", "/x:y"),
    ],
)
def test_friendly_kprobe_errors_point_at_the_users_text(
    text: str, message: str, caret_at: str
) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_probe(text, arch=X86_64)
    assert caret_under(text, info.value).startswith(caret_at)


def test_friendly_kprobe_arguments_are_lowered_to_function_arguments() -> None:
    spec = parse_probe("kr:vfs_read x=+8(arg2):u32 arg010 retval", arch=X86_64)
    assert isinstance(spec, ProbeSpec)
    assert [str(a) for a in spec.args] == ["x=+8($arg2):u32", "arg010=$arg010", "retval=$retval"]
    assert spec.args[1].fetch == FunctionArg(10)
    assert spec.source == "kr:vfs_read x=+8(arg2):u32 arg010 retval"


def test_usdt_types_are_checked_while_parsing() -> None:
    text = "usdt:./prog:prov:name x=arg1:u65"
    with pytest.raises(SpecError, match="unknown type 'u65'") as info:
        parse_probe(text, arch=X86_64)
    assert caret_under(text, info.value) == "u65"
    spec = parse_probe("usdt:./prog:prov:name x=arg1:u8[4] arg2:string", arch=X86_64)
    assert isinstance(spec, UsdtSpec)


def test_numbered_event_names_stay_within_the_kernels_limit() -> None:
    assert numbered("malloc", 1) == "malloc_1"
    for number in (1, 9, 10, 99, 100, 12345, 10**20):
        name = numbered("x" * 70, number)
        assert len(name) == MAX_EVENT_LEN and name.endswith(f"_{number}")
    assert first_free("f", set()) == "f"
    assert first_free("f", {"f", "f_1", "f_3"}) == "f_2"
    long = "y" * 63
    assert first_free(long, {long}) == "y" * 61 + "_1"


def test_an_if_tail_is_the_probes_filter() -> None:
    probe = friendly("c:malloc size=arg1:u64 if size > 1024 && size < 8192")
    assert probe.filter == "size > 1024 && size < 8192"
    assert [a.name for a in probe.args] == ["size"]
    assert friendly("r:c:malloc ret=retval if ret == 0").filter == "ret == 0"
    assert friendly("c:malloc").filter is None
    usdt = parse_probe("usdt:python3:python:function__entry f=arg1:string if f ~ 'json*'")
    assert isinstance(usdt, UsdtSpec)
    assert usdt.filter == "f ~ 'json*'" and [a.name for a in usdt.args] == ["f"]


@pytest.mark.parametrize(
    ("text", "message", "caret_at"),
    [
        ("c:malloc size=arg1:u64 if", "no filter expression after 'if'", "if"),
        ("c:malloc size=arg1:u64 if size >", "missing value after '>'", ""),
        ("c:malloc size=arg1:u64 if size > 1 &&", "where a predicate should follow", ""),
        ("c:malloc size=arg1:u64 if (size > 1", "unbalanced parenthesis", "(size"),
        ("usdt:python3:python:function__entry arg1 if", "no filter expression", "if"),
    ],
)
def test_a_bad_filter_is_found_while_parsing(text: str, message: str, caret_at: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_probe(text, arch=X86_64)
    assert info.value.column is not None and info.value.column >= text.index(" if")
    assert text[info.value.column :].startswith(caret_at)


def test_a_uprobe_definition_line_never_carries_the_filter() -> None:
    """uprobe_events refuses `if`: the filter travels beside the line, for the engine (the
    tracefs engine writes it to the event's filter file)."""
    spec = parse_probe("p:g/e /bin/true:0x10 a=%di", arch=X86_64)
    assert isinstance(spec, ProbeSpec)
    filtered = parse_probe("p:g/e /bin/true:0x10 a=%di if a > 1", arch=X86_64)
    assert isinstance(filtered, ProbeSpec) and filtered.filter == "a > 1"
    assert filtered.definition() == spec.definition()
    assert "if" not in filtered.definition()
