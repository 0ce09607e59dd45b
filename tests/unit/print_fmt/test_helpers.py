"""The `__print_*`/`__get_*` helpers and the `%p` extensions, with the kernel's answers
(kernel/trace/trace_output.c, lib/vsprintf.c)."""

from __future__ import annotations

import struct

import pytest

from probescope.errors import RingBufferFormatError
from probescope.traceevent.print_fmt import PrintFmtError
from unit.print_fmt.support import render

FLAGS = ["unsigned long flags;8;0"]


@pytest.mark.parametrize(
    ("table", "value", "expected"),
    [
        ('{ 1, "A" }, { 2, "B" }, { 3, "AB" }', 3, "A|B"),
        ('{ 3, "AB" }, { 1, "A" }, { 2, "B" }', 3, "AB"),
        ('{ 1, "A" }, { 2, "B" }', 5, "A|0x4"),
        ('{ 1, "A" }, { 2, "B" }', 8, "0x8"),
        ('{ 1, "A" }', 0, ""),
        ('{ 0, "Z" }, { 1, "A" }', 1, "Z|A"),
        ('{ 1, "" }, { 2, "B" }', 3, "|B"),
        ('{ 1, "A" }, { 0, ((void *)0) }, { 2, "B" }', 3, "A|0x2"),
    ],
)
def test_print_flags(table: str, value: int, expected: str) -> None:
    assert render(FLAGS, f'"%s", __print_flags(REC->flags, "|", {table})', value) == expected


def test_print_flags_without_a_delimiter_and_of_a_negative_int() -> None:
    assert render(FLAGS, '"%s", __print_flags(REC->flags, "", { 1, "a" }, { 2, "b" })', 3) == "ab"
    text = render(["int v;4;1"], '"%s", __print_flags(REC->v, "|", { 1, "A" })', -1)
    assert text == "A|0xfffffffffffffffe"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, "one"), (2, "0x2"), (3, "three"), (-1, "0xffffffffffffffff"), (9, "0x9")],
)
def test_print_symbolic(value: int, expected: str) -> None:
    table = '{ 1, "one" }, { 1, "uno" }, { 2, "" }, { 3, "th" "ree" }'
    fmt = f'"%s", __print_symbolic(REC->v, {table})'
    assert render(["long v;8;1"], fmt, value) == expected


def test_print_symbolic_of_an_empty_table() -> None:
    assert render(["int v;4;1"], '"%s", __print_symbolic(REC->v, { })', 7) == "0x7"


def test_print_hex_and_hex_str() -> None:
    fields = ["__data_loc u8[] buf;4;0", "int len;4;1"]
    data = bytes(range(20))
    spaced = render(fields, '"%s", __print_hex(__get_dynamic_array(buf), REC->len)', data, 20)
    assert spaced == " ".join(f"{b:02x}" for b in data)
    joined = render(fields, '"%s", __print_hex_str(__get_dynamic_array(buf), REC->len)', data, 20)
    assert joined == data.hex()
    assert render(fields, '"[%s]", __print_hex(__get_dynamic_array(buf), 0)', data, 0) == "[]"
    with pytest.raises(RingBufferFormatError, match="reads 30 bytes"):
        render(fields, '"%s", __print_hex(__get_dynamic_array(buf), REC->len)', data, 30)


def test_print_array_and_dynamic_array() -> None:
    fields = ["__data_loc u32[] vals;4;0", "u16 small[3];6;0"]
    words = struct.pack("<3I", 1, 0x10, 0xFFFFFFFF)
    fmt = (
        '"%s %s %s", __print_array(__get_dynamic_array(vals), 3, 4), '
        "__print_dynamic_array(vals, 4), __print_array(REC->small, 3, 2)"
    )
    assert render(fields, fmt, words, (7, 8, 9)) == (
        "{0x1,0x10,0xffffffff} {0x1,0x10,0xffffffff} {0x7,0x8,0x9}"
    )


def test_bitmaps() -> None:
    fields = ["__data_loc unsigned long[] mask;4;0", "u8 bits[2];2;0"]
    mask = (0x3).to_bytes(8, "little")
    fmt = '"%s %*pb %*pbl", __get_bitmask(mask), 12, REC->bits, 12, REC->bits'
    assert render(fields, fmt, mask, (0x23, 0x0F)) == "00000000,00000003 f23 0-1,5,8-11"


IP_FIELDS = ["u8 v4[4];4;0", "u8 v6[16];16;0"]


@pytest.mark.parametrize(
    ("v6", "expected"),
    [
        ("::1", "::1"),
        ("2001:db8::1", "2001:db8::1"),
        ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),
        ("1:0:0:2:0:0:3:4", "1::2:0:0:3:4"),
        ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
        ("fe80::5efe:a00:1", "fe80::5efe:10.0.0.1"),
        ("::", "::"),
    ],
)
def test_ipv6_compressed(v6: str, expected: str) -> None:
    import ipaddress

    packed = tuple(ipaddress.IPv6Address(v6).packed)
    assert render(IP_FIELDS, '"%pI6c", REC->v6', (0, 0, 0, 0), packed) == expected


def test_ip_addresses() -> None:
    v4, v6 = (127, 0, 0, 1), tuple(range(16))
    fmt = '"%pI4 %pi4 %pI6 %pi6", REC->v4, REC->v4, REC->v6, REC->v6'
    assert render(IP_FIELDS, fmt, v4, v6) == (
        "127.0.0.1 127.000.000.001 0001:0203:0405:0607:0809:0a0b:0c0d:0e0f "
        "000102030405060708090a0b0c0d0e0f"
    )


def test_sockaddr() -> None:
    fields = ["__data_loc u8[] addr;4;0"]
    sin = struct.pack("<H", 2) + struct.pack(">H", 8080) + bytes([10, 0, 0, 1]) + bytes(8)
    sin6 = (
        struct.pack("<H", 10)
        + struct.pack(">HI", 443, 0x12345678)
        + bytes(15)
        + b"\x01"
        + struct.pack("<I", 3)
    )
    fmt = '"%pISpc|%pIS|%pISpfsc", __get_sockaddr(addr), __get_sockaddr(addr), __get_sockaddr(addr)'
    assert render(fields, fmt, sin) == "10.0.0.1:8080|10.0.0.1|10.0.0.1:8080"
    assert (
        render(fields, fmt, sin6)
        == "[::1]:443|0000:0000:0000:0000:0000:0000:0000:0001|[::1]:443/36984440%3"
    )
    assert render(fields, '"%pISpc", __get_sockaddr(addr)', bytes(16)) == "(einval)"


def test_mac_uuid_and_hex_string() -> None:
    fields = ["u8 mac[6];6;0", "u8 uuid[16];16;0"]
    mac = (0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF)
    fmt = '"%pM %pm %pMR %pMF", REC->mac, REC->mac, REC->mac, REC->mac'
    assert render(fields, fmt, mac, tuple(range(16))) == (
        "aa:bb:cc:dd:ee:ff aabbccddeeff ff:ee:dd:cc:bb:aa aa-bb-cc-dd-ee-ff"
    )
    fmt = '"%pU %pUl %pUB", REC->uuid, REC->uuid, REC->uuid'
    assert render(fields, fmt, mac, tuple(range(16))) == (
        "00010203-0405-0607-0809-0a0b0c0d0e0f 03020100-0504-0706-0809-0a0b0c0d0e0f "
        "00010203-0405-0607-0809-0A0B0C0D0E0F"
    )
    fmt = '"%*ph|%*phN|%phC|%*phD", 3, REC->mac, 3, REC->mac, REC->mac, 2, REC->mac'
    assert render(fields, fmt, mac, tuple(range(16))) == "aa bb cc|aabbcc|aa|aa-bb"


def test_bytes_rebuilt_from_decoded_text_are_refused() -> None:
    fields = ["unsigned char addr[6];6;0", "__data_loc char[] data;4;0"]
    with pytest.raises(PrintFmtError, match="first NUL"):
        render(fields, '"%pM", REC->addr', "ab", "x")
    with pytest.raises(PrintFmtError, match="without its last byte"):
        render(fields, '"%s", __print_hex(__get_dynamic_array(data), 2)', "ab", "x")
    assert render(fields, '"%s", (char *)__get_dynamic_array(data)', "ab", "xyz") == "xyz"
