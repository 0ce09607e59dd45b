"""printf conversions against glibc's snprintf where C and the kernel agree, and the kernel's
own answers (lib/vsprintf.c `number()`, `string()`) where they do not."""

from __future__ import annotations

import ctypes

from hypothesis import given, settings
from hypothesis import strategies as st

from probescope.traceevent.vsprintf import number, string
from unit.print_fmt.support import render

_LIBC = ctypes.CDLL(None)
_INTS = {
    (1, True): ("char", ctypes.c_int, "s8"),
    (1, False): ("unsigned char", ctypes.c_int, "u8"),
    (2, True): ("short", ctypes.c_int, "s16"),
    (2, False): ("unsigned short", ctypes.c_int, "u16"),
    (4, True): ("int", ctypes.c_int, "s32"),
    (4, False): ("unsigned int", ctypes.c_uint, "u32"),
    (8, True): ("long", ctypes.c_long, "s64"),
    (8, False): ("unsigned long", ctypes.c_ulong, "u64"),
}


def glibc(fmt: str, value: object) -> str:
    buffer = ctypes.create_string_buffer(512)
    _LIBC.snprintf(buffer, 512, fmt.encode(), value)
    return buffer.value.decode()


@st.composite
def conversions(draw: st.DrawFn) -> tuple[int, bool, int, str]:
    size, signed = draw(st.sampled_from(sorted(_INTS)))
    bits = size * 8
    if signed:
        value = draw(st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1))
    else:
        value = draw(st.integers(0, (1 << bits) - 1))
    flags = "".join(draw(st.lists(st.sampled_from("-+ #0"), max_size=3, unique=True)))
    width = draw(st.sampled_from(["", "1", "5", "12", "24"]))
    precision = draw(st.sampled_from(["", "", ".0", ".3", ".12"]))
    letter = draw(st.sampled_from("diuxXo"))
    qualifier = (
        draw(st.sampled_from(["l", "ll", "z"]))
        if size == 8
        else draw(st.sampled_from(["", "h", "hh"]))
    )
    return size, signed, value, f"%{flags}{width}{precision}{qualifier}{letter}"


def _kernel_differs(fmt: str, value: int) -> bool:
    """Where the kernel's number() is not C's: the 0 flag still pads when a precision is
    given; `%#x` of 0 prints 0x0; `%.0d` of 0 prints 0; `%#.No` puts its 0 before the
    precision's zeros."""
    spec = fmt[1:]
    flags = spec[: len(spec) - len(spec.lstrip("-+ #0"))]
    precision = spec.split(".")[1].rstrip("hlzdiuxXo") if "." in spec else None
    letter = spec[-1]
    qualifier = spec.rstrip("diuxXo")[len(spec.rstrip("diuxXo").rstrip("hlz")) :]
    bits = {"hh": 8, "h": 16, "": 32}.get(qualifier, 64)
    value &= (1 << bits) - 1
    return (
        (precision is not None and "0" in flags and "-" not in flags)
        or ("#" in flags and letter in "xX" and value == 0)
        or (precision == "0" and value == 0)
        or ("#" in flags and letter == "o" and precision is not None)
    )


@settings(max_examples=500, deadline=None)
@given(conversions())
def test_integer_conversions_agree_with_glibc(case: tuple[int, bool, int, str]) -> None:
    size, signed, value, fmt = case
    declaration, ctype, _ = _INTS[(size, signed)]
    ours = render([f"{declaration} v;{size};{int(signed)}"], f'"[{fmt}]", REC->v', value)
    if not _kernel_differs(fmt, value):
        assert ours == "[" + glibc(fmt, ctype(value)) + "]", fmt


def test_kernel_number_where_c_differs() -> None:
    special, zeropad, small, sign = 64, 16, 32, 1
    assert number(0, 16, special | small, -1, -1) == "0x0"
    assert number(0, 8, special, -1, -1) == "0"
    assert number(8, 8, special, -1, 5) == "000010"
    assert number(0, 10, sign, -1, 0) == "0"
    assert number(5, 10, sign | zeropad, 8, 3) == "00000005"
    assert number(-5, 10, sign | zeropad, 8, 3) == "-0000005"
    assert (
        render(["unsigned int v;4;0"], '"%#x %#08x %#o", REC->v, REC->v, REC->v', 0)
        == "0x0 0x000000 0"
    )


def test_conversion_reads_its_own_width_from_the_argument() -> None:
    fields = ["int a;4;1", "unsigned long b;8;0", "long c;8;1"]
    text = render(
        fields,
        '"%u %x %hhd %hu %ld %lu %d", REC->a, REC->b, REC->a, REC->a, REC->c, REC->c, REC->a',
        -1,
        (1 << 40) + 0xFF,
        -1,
    )
    assert text == "4294967295 ff -1 65535 -1 18446744073709551615 -1"
    assert render(["short s;2;1"], '"%d %u %x", REC->s, REC->s, REC->s', -2) == (
        "-2 4294967294 fffffffe"
    )
    assert render(["unsigned char u;1;0"], '"%d %c", REC->u, REC->u', 200) == "200 \udcc8"


def test_int_passed_to_a_long_conversion_is_zero_extended() -> None:
    assert render(["int a;4;1"], '"%ld %lx", REC->a, REC->a', -1) == "4294967295 ffffffff"


def test_width_and_precision_from_arguments() -> None:
    fields = ["int w;4;1", "int p;4;1", "char s[8];8;1"]
    text = render(
        fields,
        '"[%*d] [%.*s] [%-*s]", REC->w, REC->p, REC->p, REC->s, REC->w, REC->s',
        6,
        3,
        "abcdef",
    )
    assert text == "[     3] [abc] [abcdef]"
    assert render(fields, '"[%*d]", REC->w, REC->p', -4, 7, "") == "[7   ]"
    assert render(fields, '"[%.*s]", REC->w, REC->s', -4, 0, "abc") == "[]"


def test_strings_count_bytes_not_characters() -> None:
    assert string("h\u00e9llo", 8, -1, False) == "  h\u00e9llo"
    assert string("h\u00e9llo", -1, 2, False) == "h\udcc3"
    assert string(None, 8, -1, True) == "(null)  "


def test_char_conversion() -> None:
    fields = ["char c;1;1"]
    assert render(fields, '"[%c] [%3c] [%-3c]", REC->c, REC->c, REC->c', 65) == "[A] [  A] [A  ]"


def test_percent_and_invalid_conversions() -> None:
    assert render(["int a;4;1"], '"100%% %d", REC->a', 5) == "100% 5"
    assert render(["int a;4;1"], '"a=%d %q rest", REC->a, REC->a', 5) == "a=5 "


def test_tabs_and_newlines_in_the_format_are_printed_as_they_are() -> None:
    assert render(["int a;4;1"], '"a=%d\tb\\n\n", REC->a', 5) == "a=5\tb\\n\n"
