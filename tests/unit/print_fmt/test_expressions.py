"""C expressions of print fmts evaluated with C's integer rules (x86-64: int 32, long 64)."""

from __future__ import annotations

import pytest

from unit.print_fmt.support import render

SCALARS = ["int i;4;1", "unsigned int u;4;0", "long l;8;1", "unsigned char c;1;0"]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("-1 == 0xffffffff", "1"),  # a hex literal that does not fit int is unsigned int
        ("-1 < 0U", "0"),  # int converted to unsigned int
        ("-1L < 0U", "1"),  # unsigned int converted to long
        ("1 << 31", "-2147483648"),
        ("(unsigned char)300", "44"),
        ("(signed char)200", "-56"),
        ("(bool)5 + (bool)0", "1"),
        ("-7 / 2", "-3"),  # division truncates toward zero
        ("-7 % 2", "-1"),
        ("'A' + '\\n'", "75"),
        ("!5 + !0", "1"),
        ("(1 ? 2 : 3) + (0 ? 2 : 3)", "5"),
        ("1 && 0 || 1", "1"),
        ("0x10 | 0x01 ^ 0x03 & 0x06", "19"),
        ("sizeof(u32) + sizeof(unsigned long)", "12"),
        ("(int)(2147483647 + 1U)", "-2147483648"),
    ],
)
def test_constant_expressions(expression: str, expected: str) -> None:
    assert render(["int i;4;1"], f'"%d", (int)({expression})', 0) == expected


def test_unsigned_arithmetic_wraps_and_mixes_like_c() -> None:
    args = (-5, 3, -(1 << 40), 250)
    assert render(SCALARS, '"%u", REC->u - 4', *args) == "4294967295"
    assert render(SCALARS, '"%d", REC->i + REC->u > 0', *args) == "1"
    assert render(SCALARS, '"%ld", REC->l + REC->u', *args) == str(-(1 << 40) + 3)
    assert render(SCALARS, '"%d", REC->c + REC->c', *args) == "500"  # promoted to int
    assert render(SCALARS, '"%x", ~REC->u', *args) == "fffffffc"
    assert render(SCALARS, '"%d", REC->i >> 1', *args) == "-3"  # arithmetic shift
    assert render(SCALARS, '"%u", REC->u << 31', *args) == "2147483648"
    assert render(SCALARS, '"%lu", (unsigned long)REC->i', *args) == str((1 << 64) - 5)


def test_long_expression_printed_by_a_narrower_conversion() -> None:
    fields = ["unsigned long expires;8;0", "unsigned long now;8;0"]
    assert render(fields, '"[timeout=%ld]", (long)REC->expires - REC->now', 5, 8) == (
        "[timeout=-3]"
    )


def test_the_sched_switch_state_expression() -> None:
    mask = "((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010"
    mask += " | 0x00000020 | 0x00000040) + 1) << 1) - 1)"
    flags = ", ".join(f'{{ {1 << n:#010x}, "{letter}" }}' for n, letter in enumerate("SDTtXZPI"))
    fmt = (
        f'"prev_state=%s%s", (REC->prev_state & {mask}) ? __print_flags(REC->prev_state & '
        f'{mask}, "|", {flags}) : "R", REC->prev_state & ({mask} + 1) ? "+" : ""'
    )
    fields = ["long prev_state;8;1"]
    assert render(fields, fmt, 0) == "prev_state=R"
    assert render(fields, fmt, 1) == "prev_state=S"
    assert render(fields, fmt, 0x82) == "prev_state=D|I"
    assert render(fields, fmt, 0x100) == "prev_state=R+"


def test_fields_arrays_and_common_fields() -> None:
    fields = ["char comm[16];16;1", "u32 vals[3];12;0", "pid_t pid;4;1"]
    fmt = '"%s %u %d %d %d", REC->comm, REC->vals[2], REC->pid, REC->common_pid, REC->common_type'
    assert render(fields, fmt, "bash", (1, 2, 3), 7, tid=99) == "bash 3 7 99 900"


def test_dynamic_strings_and_lengths() -> None:
    fields = ["__data_loc char[] name;4;0", "__data_loc u8[] blob;4;0"]
    fmt = (
        '"%s|%u|%u", __get_str(name), __get_dynamic_array_len(name), __get_dynamic_array_len(blob)'
    )
    assert render(fields, fmt, "eth0\0junk", b"\x01\x02\x03") == "eth0|10|3"
    assert render(fields, fmt, None, b"") == "|0|0"


def test_ternary_of_strings_and_null() -> None:
    fields = ["int on;4;1"]
    fmt = '"%s %s", REC->on ? "yes" : "no", REC->on ? "set" : ((void *)0)'
    assert render(fields, fmt, 1) == "yes set"
    assert render(fields, fmt, 0) == "no (null)"


def test_time_helpers_and_builtin_expect() -> None:
    fields = ["u64 ns;8;0"]
    fmt = (
        '"%llu.%09u %d", __print_ns_to_secs(REC->ns), __print_ns_without_secs(REC->ns), '
        "__builtin_expect(!!(REC->ns), 1)"
    )
    assert render(fields, fmt, 12_000_000_345) == "12.000000345 1"


def test_pointers_compare_and_print_as_unsigned_long() -> None:
    fields = ["void * ptr;8;0"]
    fmt = '"%d %lx %px", REC->ptr != ((void *)0), (unsigned long)REC->ptr, REC->ptr'
    assert render(fields, fmt, 0xFFFF888100D95050) == ("1 ffff888100d95050 ffff888100d95050")
