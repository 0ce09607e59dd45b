"""The kernel's printf (lib/vsprintf.c) and trace output helpers (kernel/trace/trace_output.c),
over the values of a decoded record: `number()` and `string()` with their flags, width and
precision, `%p` extensions (MAC and IP addresses, UUIDs, bitmaps, hex strings),
`__print_flags`/`__print_symbolic`/`__print_hex`/`__print_array`, and `format_decode`, which
cuts a format into literal runs and conversions. Compiled print fmts call these at run time
(see `RUNTIME`); they raise `RingBufferFormatError` where the kernel would read memory the
record does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probescope.errors import RingBufferFormatError
from probescope.traceevent.c_types import MASK64

SIGN, LEFT, PLUS, SPACE, ZEROPAD, SMALL, SPECIAL = 1, 2, 4, 8, 16, 32, 64
"""The flag bits of lib/vsprintf.c's `struct printf_spec`."""

_CHARS = tuple(bytes([b]).decode("utf-8", "surrogateescape") for b in range(256))
_HEX = "0123456789ABCDEF"


def number(num: int, base: int, flags: int, width: int, precision: int) -> str:
    """lib/vsprintf.c `number()`: `num` is signed when SIGN is set, else unsigned."""
    need_prefix = bool(flags & SPECIAL) and base != 10
    is_zero = num == 0
    if flags & LEFT:
        flags &= ~ZEROPAD
    sign = ""
    if flags & SIGN:
        if num < 0:
            sign = "-"
            num = -num
            width -= 1
        elif flags & PLUS:
            sign = "+"
            width -= 1
        elif flags & SPACE:
            sign = " "
            width -= 1
    if need_prefix:
        if base == 16:
            width -= 2
        elif not is_zero:
            width -= 1
    if base == 10:
        digits = str(num)
    elif base == 8:
        digits = format(num, "o")
    else:
        digits = format(num, "x" if flags & SMALL else "X")
    precision = max(precision, len(digits))
    width -= precision
    out: list[str] = []
    if not flags & (ZEROPAD | LEFT) and width > 0:
        out.append(" " * width)
        width = 0
    out.append(sign)
    if need_prefix:
        if base == 16 or not is_zero:
            out.append("0")
        if base == 16:
            out.append("x" if flags & SMALL else "X")
    if not flags & LEFT and width > 0:
        out.append(("0" if flags & ZEROPAD else " ") * width)
        width = 0
    out.append("0" * (precision - len(digits)))
    out.append(digits)
    if width > 0:
        out.append(" " * width)
    return "".join(out)


def _widen(text: str, length: int, width: int, left: bool) -> str:
    if length >= width:
        return text
    pad = " " * (width - length)
    return text + pad if left else pad + text


def string(text: str | None, width: int, precision: int, left: bool) -> str:
    """`string()`: at most `precision` bytes (-1: all), padded to `width` bytes."""
    if text is None:
        return string("(null)", width, 16 if precision < 0 else precision, left)
    if text.isascii():
        if precision >= 0:
            text = text[:precision]
        return _widen(text, len(text), width, left)
    data = text.encode("utf-8", "surrogateescape")
    if precision >= 0:
        data = data[:precision]
    return _widen(data.decode("utf-8", "surrogateescape"), len(data), width, left)


def _cstring(value: str | None) -> str:
    """A `__data_loc` string as `%s` reads it: up to the first NUL."""
    if value is None:
        return ""
    return value.partition("\0")[0]


def _buffer_string(data: bytes) -> str:
    return data.partition(b"\0")[0].decode("utf-8", "surrogateescape")


def _string_bytes(value: str | None, size: int = 0) -> bytes:
    """The record bytes behind a decoded string (NUL-terminated, padded to `size`)."""
    data = b"" if value is None else value.encode("utf-8", "surrogateescape") + b"\0"
    if size > len(data):
        data += b"\0" * (size - len(data))
    return data


def _dynamic_length(value: str | bytes | None) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape")) + 1
    return len(value)


def _pack(values: Sequence[int], size: int) -> bytes:
    return b"".join((v & ((1 << (size * 8)) - 1)).to_bytes(size, "little") for v in values)


def _char(value: int, width: int, left: bool) -> str:
    ch = _CHARS[value & 0xFF]
    if width <= 1:
        return ch
    return ch + " " * (width - 1) if left else " " * (width - 1) + ch


def _print_flags(value: int, delimiter: str | None, table: tuple[tuple[int, str], ...]) -> str:
    """`trace_print_flags_seq`."""
    parts: list[str] = []
    first = True
    for mask, name in table:
        if not value:
            break
        if value & mask != mask:
            continue
        value &= ~mask
        if not first and delimiter:
            parts.append(delimiter)
        else:
            first = False
        parts.append(name)
    if value:
        if not first and delimiter:
            parts.append(delimiter)
        parts.append(f"0x{value:x}")
    return "".join(parts)


def _print_symbolic(value: int, table: Mapping[int, str]) -> str:
    """`trace_print_symbols_seq`: the first name for `value` (an empty name counts as none)."""
    return table.get(value) or f"0x{value:x}"


class _ShortBuffer(RingBufferFormatError):
    pass


def _need(data: bytes, length: int, what: str) -> bytes:
    if length > len(data):
        raise _ShortBuffer(
            f"{what} reads {length} bytes but the record holds {len(data)}; the kernel would "
            "print memory after the record, which a decoded event does not have"
        )
    return data


def _print_hex(data: bytes, length: int, concatenate: bool) -> str:
    """`trace_print_hex_seq`: `%*ph` (or `%*phN`) per 16 bytes, chunks apart by a space."""
    if length <= 0:
        return ""
    _need(data, length, "__print_hex")
    parts: list[str] = []
    for start in range(0, length, 16):
        chunk = data[start : min(start + 16, length)]
        if concatenate:
            parts.append(chunk.hex())
        else:
            if start:
                parts.append(" ")
            parts.append(chunk.hex(" "))
    return "".join(parts)


def _print_array(data: bytes, count: int, size: int) -> str:
    """`trace_print_array_seq`: `{0x1,0x2}`, elements read in host (little-endian) order."""
    if count < 0:
        raise _ShortBuffer(f"__print_array of {count} elements")
    _need(data, count * size, "__print_array")
    values = [int.from_bytes(data[i : i + size], "little") for i in range(0, count * size, size)]
    return "{" + ",".join(f"0x{v:x}" for v in values) + "}"


def _bitmap(data: bytes, bits: int) -> str:
    """`%*pb`: the bitmap in 32-bit hex chunks, most significant first."""
    bits = max(bits, 0)
    value = int.from_bytes(data, "little")
    chunk = bits & 31 or 32
    position = ((bits + 31) & ~31) - 32
    parts: list[str] = []
    while position >= 0:
        part = (value >> position) & ((1 << chunk) - 1)
        parts.append(f"{part:0{(chunk + 3) // 4}x}")
        chunk = 32
        position -= 32
    return ",".join(parts)


def _bitmap_list(data: bytes, bits: int) -> str:
    """`%*pbl`: ranges of set bits, `0-3,5`."""
    value = int.from_bytes(data, "little") & ((1 << max(bits, 0)) - 1)
    parts: list[str] = []
    bit = 0
    while value >> bit:
        if not (value >> bit) & 1:
            bit += 1
            continue
        first = bit
        while (value >> bit) & 1:
            bit += 1
        parts.append(str(first) if bit - 1 == first else f"{first}-{bit - 1}")
    return ",".join(parts)


def _bitmask(data: bytes) -> str:
    """`__get_bitmask`: `trace_print_bitmask_seq`, i.e. `%*pb` over all of the array."""
    return _bitmap(data, len(data) * 8)


def _mac(data: bytes, extension: str) -> str:
    _need(data, 6, "%p" + extension)
    octets = data[:6]
    if extension[1:2] == "R":
        octets = octets[::-1]
    if extension[0] == "m":
        return octets.hex()
    return octets.hex("-" if extension[1:2] == "F" else ":")


def _ip4(data: bytes, leading_zeros: bool, order: str) -> str:
    octets = list(data[:4])
    if order in ("h", "l"):
        octets.reverse()
    return ".".join(f"{o:03d}" if leading_zeros else str(o) for o in octets)


def _ip6_full(data: bytes, colons: bool) -> str:
    words = [data[i : i + 2].hex() for i in range(0, 16, 2)]
    return (":" if colons else "").join(words)


def _ip6_compressed(data: bytes) -> str:
    words = [int.from_bytes(data[i : i + 2], "big") for i in range(0, 16, 2)]
    v4mapped = words[:5] == [0, 0, 0, 0, 0] and words[5] == 0xFFFF
    isatap = (data[8] | 0x02) == 0x02 and data[9] == 0 and data[10] == 0x5E and data[11] == 0xFE
    use_ipv4 = v4mapped or isatap
    count = 6 if use_ipv4 else 8
    longest, colon_at = 1, -1
    for i in range(count):
        run = 0
        while i + run < count and words[i + run] == 0:
            run += 1
        if run > longest:
            longest, colon_at = run, i
    out: list[str] = []
    need_colon = False
    i = 0
    while i < count:
        if i == colon_at:
            if need_colon or i == 0:
                out.append(":")
            out.append(":")
            need_colon = False
            i += longest
            continue
        if need_colon:
            out.append(":")
        out.append(f"{words[i]:x}")
        need_colon = True
        i += 1
    if use_ipv4:
        if need_colon:
            out.append(":")
        out.append(_ip4(data[12:16], False, "n"))
    return "".join(out)


def _ip(data: bytes, extension: str) -> str:
    """`%pI4`, `%pi4`, `%pI6`, `%pI6c`, `%pi6` and the `struct sockaddr` forms `%pIS[pfsc]`."""
    kind, version = extension[0], extension[1:2]
    if version == "4":
        _need(data, 4, "%p" + extension)
        return _ip4(data, kind == "i", extension[2:3])
    if version == "6":
        _need(data, 16, "%p" + extension)
        if kind == "I" and extension[2:3] == "c":
            return _ip6_compressed(data[:16])
        return _ip6_full(data[:16], kind == "I")
    _need(data, 2, "%p" + extension)
    family = int.from_bytes(data[:2], "little")
    letters = extension[2:]
    if family == 2:
        _need(data, 8, "%p" + extension)
        order = "n"
        for letter in letters:
            if letter in "hlnb":
                order = letter
        text = _ip4(data[4:8], kind == "i", order)
        if "p" in letters:
            text += f":{int.from_bytes(data[2:4], 'big')}"
        return text
    if family == 10:
        _need(data, 28, "%p" + extension)
        address = data[8:24]
        bracket = any(letter in letters for letter in "psf")
        if kind == "I" and "c" in letters:
            text = _ip6_compressed(address)
        else:
            text = _ip6_full(address, kind == "I")
        if bracket:
            text = f"[{text}]"
        if "p" in letters:
            text += f":{int.from_bytes(data[2:4], 'big')}"
        if "f" in letters:
            text += f"/{int.from_bytes(data[4:8], 'big') & 0x0FFFFFFF}"
        if "s" in letters:
            text += f"%{int.from_bytes(data[24:28], 'little')}"
        return text
    return "(einval)"


_GUID_ORDER = (3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15)


def _uuid(data: bytes, extension: str) -> str:
    _need(data, 16, "%p" + extension)
    variant = extension[1:2]
    order = _GUID_ORDER if variant in ("l", "L") else range(16)
    text = bytes(data[i] for i in order).hex()
    text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    return text.upper() if variant in ("B", "L") else text


def _hex_string(data: bytes, width: int, separator: str) -> str:
    """`%ph`: `width` bytes (1 when none is given, at most 64) in hex."""
    if width == 0:
        return ""
    length = 1 if width < 0 else min(width, 64)
    _need(data, length, "%ph")
    return data[:length].hex(separator) if separator else data[:length].hex()


def _kernel_string(address: int, strings: Mapping[int, str]) -> str:
    """`%s` of a kernel pointer: `string()`'s NULL and bad-pointer texts, else the text of a
    `tracepoint_string()`."""
    if address == 0:
        return "(null)"
    if address < 4096 or address >= MASK64 - 4095:
        return "(efault)"
    text = strings.get(address)
    if text is None:
        raise RingBufferFormatError(
            f"%s of kernel address {address:#x}, which is not a tracepoint_string in "
            "printk_formats: its text is in kernel memory"
        )
    return text


def _syscall_argument(value: int) -> str:
    return str(value) if value < 10 else f"0x{value:x}"


RUNTIME: dict[str, Any] = {
    "_pf_syscall_argument": _syscall_argument,
    "_pf_kernel_string": _kernel_string,
    "_pf_number": number,
    "_pf_string": string,
    "_pf_cstring": _cstring,
    "_pf_buffer_string": _buffer_string,
    "_pf_string_bytes": _string_bytes,
    "_pf_dynamic_length": _dynamic_length,
    "_pf_pack": _pack,
    "_pf_char": _char,
    "_pf_chars": _CHARS,
    "_pf_flags": _print_flags,
    "_pf_symbolic": _print_symbolic,
    "_pf_print_hex": _print_hex,
    "_pf_print_array": _print_array,
    "_pf_bitmap": _bitmap,
    "_pf_bitmap_list": _bitmap_list,
    "_pf_bitmask": _bitmask,
    "_pf_mac": _mac,
    "_pf_ip": _ip,
    "_pf_uuid": _uuid,
    "_pf_hex_string": _hex_string,
    "_pf_widen": _widen,
}
"""The helpers compiled print fmts call, by the names the generated code gives them."""


@dataclass(frozen=True)
class Conversion:
    """One `%` conversion as `format_decode` reads it: flags (SIGN, LEFT... bits), width and
    precision (-1: none given), the length qualifier and the conversion letter."""

    text: str
    flags: int
    width: int | None  # None: taken from an argument (`*`)
    precision: int | None
    qualifier: str
    conversion: str  # d i u o x X c s p %, or "" for an invalid one (printing stops there)
    extension: str = ""  # the alphanumerics after %p


def decode_format(text: str) -> list[str | Conversion]:
    """Literal runs and conversions, in order, as `format_decode` reads them."""
    pieces: list[str | Conversion] = []
    index = 0
    while index < len(text):
        percent = text.find("%", index)
        if percent < 0:
            pieces.append(text[index:])
            break
        if percent > index:
            pieces.append(text[index:percent])
        start = percent
        index = percent + 1
        flags = 0
        while index < len(text) and text[index] in "-+ #0":
            flags |= {"-": LEFT, "+": PLUS, " ": SPACE, "#": SPECIAL, "0": ZEROPAD}[text[index]]
            index += 1
        width: int | None = -1
        if index < len(text) and text[index].isdigit():
            end = index
            while end < len(text) and text[end].isdigit():
                end += 1
            width = int(text[index:end])
            index = end
        elif index < len(text) and text[index] == "*":
            width = None
            index += 1
        precision: int | None = -1
        if index < len(text) and text[index] == ".":
            index += 1
            if index < len(text) and text[index].isdigit():
                end = index
                while end < len(text) and text[end].isdigit():
                    end += 1
                precision = int(text[index:end])
                index = end
            elif index < len(text) and text[index] == "*":
                precision = None
                index += 1
        qualifier = ""
        if index < len(text) and (text[index] in "hzt" or text[index].lower() == "l"):
            qualifier = text[index]
            index += 1
            if index < len(text) and text[index] == qualifier and qualifier in "lh":
                qualifier = "L" if qualifier == "l" else "H"
                index += 1
        conversion = text[index] if index < len(text) else ""
        if conversion not in ("c", "s", "p", "%", "o", "x", "X", "d", "i", "u"):
            pieces.append(Conversion(text[start:index], flags, width, precision, qualifier, ""))
            break
        index += 1
        extension = ""
        if conversion == "p":
            end = index
            while end < len(text) and text[end].isalnum() and text[end].isascii():
                end += 1
            extension = text[index:end]
            index = end
        if conversion in ("d", "i"):
            flags |= SIGN
        if conversion == "x":
            flags |= SMALL
        pieces.append(
            Conversion(text[start:index], flags, width, precision, qualifier, conversion, extension)
        )
    return pieces


QUALIFIER_SIZE = {"H": 1, "h": 2, "": 4, "l": 8, "L": 8, "z": 8, "t": 8}
