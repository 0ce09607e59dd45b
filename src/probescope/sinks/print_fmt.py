"""Kernel-identical text for tracepoint records: each event's `print fmt`, compiled once.

The kernel prints a trace event in `trace` with `trace_raw_output_<event>`: the event name and
`": "`, then its TP_printk run through the kernel's vsnprintf (lib/vsprintf.c) with the helpers
of include/trace/stages/stage3_trace_output.h and kernel/trace/trace_output.c (`__print_flags`,
`__print_symbolic`, `__get_str`, ...). The event's `format` file keeps that TP_printk, after the
C preprocessor, as `print fmt:`. Evaluating it with C's integer rules and the kernel's printf
gives the same bytes, as long as it only reads the record. This module compiles a print fmt
into a `BodyTemplate` of the text sink (one %-format plus Python expressions over the `Event`),
and refuses at compile time, listing every problem, what it cannot reproduce from a record:
kernel functions and variables, enum names the kernel left unresolved, `%s` of kernel pointers,
hashed `%p` (the instance's `options/hash-ptr` on), `%pS` without the kernel's symbol table.

Wiring: the engine calls `register_tracepoint(event_type, event_format, ...)` for each
tracepoint it decodes; the text sink's printer for tracepoints (`registered_body`) then prints
them like `trace`. Unsupported formats raise `PrintFmtError` at registration, unless the caller
asks for `fallback=True`, which prints `NAME: <print fmt not reproduced> field=value ...` — a
rendering that cannot be mistaken for the kernel's.
"""

from __future__ import annotations

import functools
import re
import struct
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from probescope.errors import RingBufferFormatError
from probescope.events import Event, EventType
from probescope.sinks.kernel_symbols import KernelSymbols, kernel_symbols
from probescope.sinks.text import BodyTemplate
from probescope.traceevent.format import EventFormat, FormatField

Printer = Callable[[Event], str]

NOT_REPRODUCED = "<print fmt not reproduced>"
"""Marks the fallback rendering of an event whose print fmt this module cannot reproduce."""


class PrintFmtError(RingBufferFormatError):
    """A print fmt this module cannot reproduce; `problems` lists every construct at fault."""

    def __init__(self, label: str, problems: Sequence[str], *, print_fmt: str = "") -> None:
        listing = "; ".join(problems)
        super().__init__(
            f"print fmt of {label!r} cannot be reproduced: {listing}",
            hint="register the event with fallback=True to print its fields instead",
        )
        self.label = label
        self.problems = tuple(problems)
        self.print_fmt = print_fmt


# ---------------------------------------------------------------------------------------------
# Kernel symbols (`%pS`, `%ps`, `%pB`)


class KernelTypes:
    """Enum constants and integer typedefs of the running kernel, from its BTF.

    Format files keep an enum constant as a name when its TRACE_EVENT did not export it with
    TRACE_DEFINE_ENUM (`{ I_DIRTY_SYNC, "I_DIRTY_SYNC" }`, `HRTIMER_MODE_ABS`); the kernel's
    own printer has the value compiled in. `/sys/kernel/btf/vmlinux` (CONFIG_DEBUG_INFO_BTF)
    has every enum of the kernel that wrote the format, so names resolve to what that kernel
    uses. Typedef names in casts (`(__kernel_rwf_t)`) resolve through it too.
    """

    def __init__(self, enums: Mapping[str, int], typedefs: Mapping[str, tuple[int, bool]]) -> None:
        self.enums = dict(enums)
        self.typedefs = dict(typedefs)

    @classmethod
    def from_btf(cls, data: bytes) -> KernelTypes:
        """Parse raw BTF (`struct btf_header`, type and string sections, include/uapi/linux/
        btf.h): ENUM and ENUM64 members, and TYPEDEFs that end in an integer or enum."""
        if len(data) < 24:
            raise RingBufferFormatError("BTF data is shorter than its header")
        magic, _version, _flags, header_length = struct.unpack_from("<HBBI", data, 0)
        if magic != 0xEB9F:
            raise RingBufferFormatError(f"BTF magic is {magic:#x}, expected 0xeb9f")
        type_offset, type_length, string_offset, string_length = struct.unpack_from(
            "<IIII", data, 8
        )
        types = data[header_length + type_offset : header_length + type_offset + type_length]
        strings = data[
            header_length + string_offset : header_length + string_offset + string_length
        ]

        def name(offset: int) -> str:
            end = strings.find(b"\0", offset)
            return strings[offset : end if end >= 0 else len(strings)].decode("ascii", "replace")

        enums: dict[str, int] = {}
        ambiguous: set[str] = set()
        kinds: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]  # kind, size/type, signed, name
        position = 0
        while position + 12 <= len(types):
            name_offset, info, size_or_type = struct.unpack_from("<III", types, position)
            position += 12
            kind = (info >> 24) & 0x1F
            count = info & 0xFFFF
            signed = 0
            if kind == _BTF_INT:
                encoding = struct.unpack_from("<I", types, position)[0]
                signed = 1 if (encoding >> 24) & 1 else 0
            elif kind in (_BTF_ENUM, _BTF_ENUM64):
                signed = 1 if info >> 31 else 0
                step = 8 if kind == _BTF_ENUM else 12
                for member in range(count):
                    at = position + member * step
                    if kind == _BTF_ENUM:
                        member_name, value = struct.unpack_from("<II", types, at)
                        if signed and value >> 31:
                            value -= 1 << 32
                    else:
                        member_name, low, high = struct.unpack_from("<III", types, at)
                        value = high << 32 | low
                        if signed and value >> 63:
                            value -= 1 << 64
                    label = name(member_name)
                    if enums.get(label, value) != value:
                        ambiguous.add(label)
                    enums[label] = value
            kinds.append((kind, size_or_type, signed, name_offset))
            position += _BTF_FIXED.get(kind, 0) + _BTF_PER_MEMBER.get(kind, 0) * count
        for label in ambiguous:
            del enums[label]
        typedefs: dict[str, tuple[int, bool]] = {}
        for kind, target, _signed, name_offset in kinds:
            if kind != _BTF_TYPEDEF:
                continue
            for _ in range(16):
                if not 0 < target < len(kinds):
                    break
                inner, size_or_type, inner_signed, _ = kinds[target]
                if inner in (_BTF_TYPEDEF, _BTF_CONST, _BTF_VOLATILE, _BTF_RESTRICT):
                    target = size_or_type
                    continue
                if inner in (_BTF_INT, _BTF_ENUM, _BTF_ENUM64) and size_or_type in (1, 2, 4, 8):
                    typedefs[name(name_offset)] = (size_or_type, bool(inner_signed))
                break
        return cls(enums, typedefs)

    @classmethod
    def from_path(cls, path: str | Path) -> KernelTypes:
        with open(path, "rb") as stream:
            return cls.from_btf(stream.read())

    @classmethod
    def load(cls, path: str | Path = "/sys/kernel/btf/vmlinux") -> KernelTypes | None:
        """The running kernel's types, or None without BTF."""
        try:
            return cls.from_path(path)
        except (OSError, RingBufferFormatError, struct.error):
            return None


_BTF_INT, _BTF_TYPEDEF, _BTF_VOLATILE, _BTF_CONST, _BTF_RESTRICT = 1, 8, 9, 10, 11
_BTF_ENUM, _BTF_ENUM64 = 6, 19
_BTF_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_BTF_PER_MEMBER = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}


@dataclass(frozen=True)
class PrintFmtContext:
    """What a print fmt needs besides the record.

    `hash_pointers` is the instance's `options/hash-ptr`: on (the kernel's default), plain
    `%p` prints a keyed hash of the address that cannot be reproduced, so formats with `%p`
    are refused; off, `%p` prints the address (`%px`). `symbols` serve `%pS`/`%ps`/`%pB`;
    `types` resolve enum names and typedefs the format leaves as names; `enums` adds names
    of your own (they win over `types`). `strings` (`printk_formats`: address to text of each
    `tracepoint_string()`) lets `%s` print a kernel pointer such as rcu_utilization's; a
    pointer that is not among them cannot be printed, which only the record can tell (see
    `register_tracepoint`'s `fallback`).
    """

    hash_pointers: bool = True
    symbols: KernelSymbols | None = None
    types: KernelTypes | None = None
    enums: Mapping[str, int] = field(default_factory=dict)
    strings: Mapping[int, str] | None = None

    @classmethod
    def running_kernel(
        cls, *, hash_pointers: bool = True, tracefs: str | Path = "/sys/kernel/tracing"
    ) -> PrintFmtContext:
        """Symbols from /proc/kallsyms, types from /sys/kernel/btf/vmlinux and strings from
        tracefs's `printk_formats`, each where readable. Parsed once per process (seconds
        on a slow machine): every tracepoint printer shares them."""
        return _running_kernel_context(hash_pointers, str(tracefs))

    def enum_value(self, name: str) -> int | None:
        if name in self.enums:
            return self.enums[name]
        if self.types is not None:
            return self.types.enums.get(name)
        return None

    def typedef(self, name: str) -> _CType | None:
        if self.types is not None and name in self.types.typedefs:
            size, signed = self.types.typedefs[name]
            return _int(size, signed)
        return None


_PRINTK_FORMAT = re.compile(r'^0x([0-9a-fA-F]+) : "(.*)"$')


def parse_printk_formats(text: str) -> dict[int, str]:
    """tracefs `printk_formats` (`0xADDR : "TEXT"` per line) as {address: text}; the kernel
    escapes newlines, tabs and quotes there (kernel/trace/trace_printk.c `t_show`)."""
    strings: dict[int, str] = {}
    for line in text.splitlines():
        match = _PRINTK_FORMAT.match(line)
        if match:
            body = match.group(2).replace("\\n", "\n").replace("\\t", "\t")
            strings[int(match.group(1), 16)] = body.replace('\\"', '"')
    return strings


# ---------------------------------------------------------------------------------------------
# C types and values

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class _CType:
    """The C type of a compiled expression.

    `int`: an integer of `size` bytes (a `bool` when `boolean`), held in Python as its value;
    `ptr`: a kernel address (unsigned long) that cannot be dereferenced here; `str`: a `char *`
    into the record or a literal, held as `str`; `buf`: a pointer into the record whose bytes
    are known, held as `bytes`, `elem` being the element type; `array`: an integer array field,
    held as a tuple, decaying to `buf`.
    """

    kind: str
    size: int = 0
    signed: bool = False
    boolean: bool = False
    elem: _CType | None = None
    count: int = 0

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_scalar(self) -> bool:
        return self.kind in ("int", "ptr")

    def describe(self) -> str:
        if self.kind == "int":
            if self.boolean:
                return "bool"
            return f"{'s' if self.signed else 'u'}{self.size * 8}"
        return self.kind


def _int(size: int, signed: bool) -> _CType:
    return _CType("int", size, signed)


_INT = _int(4, True)
_UINT = _int(4, False)
_LONG = _int(8, True)
_ULONG = _int(8, False)
_BOOL = _CType("int", 1, False, boolean=True)
_PTR = _CType("ptr", 8, False)
_STR = _CType("str")
_U8 = _int(1, False)
_CHAR = _int(1, True)

_BASE_TYPES: dict[str, _CType] = {
    "char": _CHAR,
    "signed char": _CHAR,
    "unsigned char": _U8,
    "short": _int(2, True),
    "short int": _int(2, True),
    "signed short": _int(2, True),
    "unsigned short": _int(2, False),
    "unsigned short int": _int(2, False),
    "int": _INT,
    "signed": _INT,
    "signed int": _INT,
    "unsigned": _UINT,
    "unsigned int": _UINT,
    "uint": _UINT,
    "long": _LONG,
    "long int": _LONG,
    "signed long": _LONG,
    "unsigned long": _ULONG,
    "unsigned long int": _ULONG,
    "ulong": _ULONG,
    "long long": _LONG,
    "long long int": _LONG,
    "signed long long": _LONG,
    "unsigned long long": _ULONG,
    "unsigned long long int": _ULONG,
    "_Bool": _BOOL,
    "bool": _BOOL,
}
for _bits in (8, 16, 32, 64):
    for _prefix, _signed in (("u", False), ("s", True), ("__u", False), ("__s", True)):
        _BASE_TYPES[f"{_prefix}{_bits}"] = _int(_bits // 8, _signed)
    _BASE_TYPES[f"uint{_bits}_t"] = _int(_bits // 8, False)
    _BASE_TYPES[f"int{_bits}_t"] = _int(_bits // 8, True)
    _BASE_TYPES[f"u_int{_bits}_t"] = _int(_bits // 8, False)
    for _endian in ("le", "be"):
        _BASE_TYPES[f"__{_endian}{_bits}"] = _int(_bits // 8, False)
_BASE_TYPES.update(
    {
        "size_t": _ULONG,
        "ssize_t": _LONG,
        "ptrdiff_t": _LONG,
        "uintptr_t": _ULONG,
        "intptr_t": _LONG,
        "pid_t": _INT,
        "uid_t": _UINT,
        "gid_t": _UINT,
        "dev_t": _UINT,
        "loff_t": _LONG,
        "off_t": _LONG,
        "sector_t": _ULONG,
        "blkcnt_t": _ULONG,
        "gfp_t": _UINT,
        "ino_t": _ULONG,
        "umode_t": _int(2, False),
        "fmode_t": _UINT,
        "blk_opf_t": _UINT,
        "blk_status_t": _U8,
        "phys_addr_t": _ULONG,
        "dma_addr_t": _ULONG,
        "time64_t": _LONG,
        "ktime_t": _LONG,
        "clockid_t": _INT,
        "xfs_ino_t": _ULONG,
        "pgoff_t": _ULONG,
        "vm_fault_t": _UINT,
        "netdev_features_t": _ULONG,
    }
)
_TYPE_WORDS = frozenset(
    {"const", "volatile", "signed", "unsigned", "short", "long", "int", "char", "void"}
)


# ---------------------------------------------------------------------------------------------
# Lexer


class _Token(NamedTuple):
    kind: str  # num, char, str, ident, op, end
    text: str
    value: Any
    position: int


_PUNCTUATION = (
    "->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "++", "--",
    "(", ")", "{", "}", "[", "]", ",", "?", ":", ";", "+", "-", "*", "/", "%",
    "&", "|", "^", "~", "!", "<", ">", ".", "=",
)  # fmt: skip
_NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|[0-9]+)([uUlL]*)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIMPLE_ESCAPES = {
    "n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, "e": 27,
    "\\": 92, "'": 39, '"': 34, "?": 63,
}  # fmt: skip


class _ParseError(RingBufferFormatError):
    """Text after `print fmt:` that is not C; `position` is where (internal, never escapes)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


def _lex(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    index = 0
    while index < len(text):
        ch = text[index]
        if ch.isspace():
            index += 1
            continue
        if ch == '"' or ch == "'":
            data, end = _lex_quoted(text, index)
            if ch == '"':
                if tokens and tokens[-1].kind == "str":
                    last = tokens.pop()
                    data = last.value + data
                    tokens.append(_Token("str", text[last.position : end], data, last.position))
                else:
                    tokens.append(_Token("str", text[index:end], data, index))
            else:
                if len(data) != 1:
                    raise _ParseError(f"character constant {text[index:end]!r}", index)
                tokens.append(_Token("char", text[index:end], data[0], index))
            index = end
            continue
        if ch.isdigit():
            match = _NUMBER.match(text, index)
            if match is None:
                raise _ParseError(f"number at {text[index : index + 10]!r}", index)
            digits, suffix = match.group(1), match.group(2)
            end = match.end()
            if end < len(text) and (text[end].isalnum() or text[end] in "._"):
                raise _ParseError(f"number {text[index : end + 1]!r}", index)
            if digits.startswith(("0x", "0X")):
                value, base = int(digits, 16), 16
            elif len(digits) > 1 and digits.startswith("0"):
                if any(d in "89" for d in digits):
                    raise _ParseError(f"octal number {digits!r}", index)
                value, base = int(digits, 8), 8
            else:
                value, base = int(digits, 10), 10
            tokens.append(_Token("num", text[index:end], (value, base, suffix.lower()), index))
            index = end
            continue
        match = _IDENT.match(text, index)
        if match:
            tokens.append(_Token("ident", match.group(0), match.group(0), index))
            index = match.end()
            continue
        for punct in _PUNCTUATION:
            if text.startswith(punct, index):
                tokens.append(_Token("op", punct, punct, index))
                index += len(punct)
                break
        else:
            raise _ParseError(f"character {ch!r}", index)
    tokens.append(_Token("end", "", None, len(text)))
    return tokens


def _lex_quoted(text: str, start: int) -> tuple[bytes, int]:
    quote = text[start]
    data = bytearray()
    index = start + 1
    while True:
        if index >= len(text):
            raise _ParseError("unterminated quote", start)
        ch = text[index]
        if ch == quote:
            return bytes(data), index + 1
        if ch != "\\":
            data += ch.encode("utf-8", "surrogateescape")
            index += 1
            continue
        if index + 1 >= len(text):
            raise _ParseError("unterminated escape", index)
        nxt = text[index + 1]
        if nxt in _SIMPLE_ESCAPES:
            data.append(_SIMPLE_ESCAPES[nxt])
            index += 2
        elif nxt in "01234567":
            end = index + 1
            while end < len(text) and end < index + 4 and text[end] in "01234567":
                end += 1
            data.append(int(text[index + 1 : end], 8) & 0xFF)
            index = end
        elif nxt == "x":
            end = index + 2
            while end < len(text) and text[end] in "0123456789abcdefABCDEF":
                end += 1
            if end == index + 2:
                raise _ParseError("\\x without hex digits", index)
            data.append(int(text[index + 2 : end], 16) & 0xFF)
            index = end
        else:
            raise _ParseError(f"escape \\{nxt}", index)


# ---------------------------------------------------------------------------------------------
# Parser: C expressions as they appear after `print fmt:`


@dataclass(frozen=True)
class _Node:
    kind: str  # num str field ident call cast sizeof unary binary cond braces index addr stmt
    value: Any = None
    children: tuple[_Node, ...] = ()
    text: str = ""


_BINARY_PRECEDENCE = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
    "<": 7, ">": 7, "<=": 7, ">=": 7, "<<": 8, ">>": 8,
    "+": 9, "-": 9, "*": 10, "/": 10, "%": 10,
}  # fmt: skip


_FORMAT_END = re.compile(r'"\s*(,|$)')


def _split_print_fmt(text: str) -> tuple[str, str, int]:
    """(format string, argument text, where the arguments start) of a `print fmt:` value.

    TRACE_EVENT puts the *compiled* TP_printk string between the quotes (stage 7 of
    include/trace/trace_events.h pastes `"\"" fmt "\", "`), so it holds raw tabs, newlines
    and backslashes with no escapes; it ends at the first quote followed by a comma or the end.
    The arguments are `__stringify`'d source and keep C's escapes.
    """
    text = text.strip()
    if not text.startswith('"'):
        raise _ParseError("print fmt does not start with a string", 0)
    end = _FORMAT_END.search(text, 1)
    if end is None:
        raise _ParseError("the format string is not closed", 0)
    return text[1 : end.start()], text[end.start() + 1 :], end.start() + 1


class _Parser:
    def __init__(self, text: str, typedefs: Mapping[str, _CType]) -> None:
        self.text = text
        self.tokens = _lex(text)
        self.index = 0
        self.typedefs = typedefs

    def peek(self, offset: int = 0) -> _Token:
        return self.tokens[min(self.index + offset, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, text: str) -> _Token:
        token = self.peek()
        if token.kind != "op" or token.text != text:
            raise _ParseError(
                f"expected {text!r}, found {token.text or 'the end'!r}", token.position
            )
        return self.take()

    def at(self, text: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text == text

    def parse_arguments(self) -> list[_Node]:
        args: list[_Node] = []
        while self.at(","):
            self.take()
            args.append(self.assignment())
        if self.peek().kind != "end":
            token = self.peek()
            raise _ParseError(f"unexpected {token.text!r}", token.position)
        return args

    def source(self, start: int) -> str:
        end = self.tokens[self.index - 1]
        return self.text[start : end.position + len(end.text)].strip()

    def assignment(self) -> _Node:
        start = self.peek().position
        node = self.conditional()
        if self.at("="):
            raise _ParseError("assignment", self.peek().position)
        return _Node(node.kind, node.value, node.children, node.text or self.source(start))

    def conditional(self) -> _Node:
        start = self.peek().position
        condition = self.binary(1)
        if not self.at("?"):
            return condition
        self.take()
        then = self.assignment()
        self.expect(":")
        otherwise = self.conditional()
        return _Node("cond", None, (condition, then, otherwise), self.source(start))

    def binary(self, level: int) -> _Node:
        start = self.peek().position
        left = self.unary()
        while True:
            token = self.peek()
            precedence = _BINARY_PRECEDENCE.get(token.text) if token.kind == "op" else None
            if precedence is None or precedence < level:
                return left
            self.take()
            right = self.binary(precedence + 1)
            left = _Node("binary", token.text, (left, right), self.source(start))

    def unary(self) -> _Node:
        start = self.peek().position
        token = self.peek()
        if token.kind == "op" and token.text in ("-", "+", "!", "~"):
            self.take()
            operand = self.unary()
            return _Node("unary", token.text, (operand,), self.source(start))
        if token.kind == "op" and token.text == "&":
            self.take()
            operand = self.unary()
            return _Node("addr", None, (operand,), self.source(start))
        if token.kind == "op" and token.text == "*":
            self.take()
            operand = self.unary()
            return _Node("deref", None, (operand,), self.source(start))
        if token.kind == "op" and token.text in ("++", "--"):
            raise _ParseError(f"{token.text} operator", token.position)
        if token.kind == "ident" and token.text == "sizeof":
            self.take()
            if self.at("(") and self.is_type_start(1):
                self.take()
                type_name = self.type_name()
                self.expect(")")
                return _Node("sizeof", type_name, (), self.source(start))
            operand = self.unary()
            return _Node("sizeof_expr", None, (operand,), self.source(start))
        if token.kind == "op" and token.text == "(" and self.is_type_start(1):
            self.take()
            type_name = self.type_name()
            self.expect(")")
            operand = self.unary()
            return _Node("cast", type_name, (operand,), self.source(start))
        return self.postfix()

    def is_type_start(self, offset: int) -> bool:
        token = self.peek(offset)
        if token.kind != "ident":
            return False
        if token.text in _TYPE_WORDS or token.text in ("struct", "union", "enum"):
            return True
        if token.text in self.typedefs:
            after = self.peek(offset + 1)
            return after.kind == "op" and after.text in (")", "*")
        after = self.peek(offset + 1)
        if after.kind == "op" and after.text == "*":
            closing = self.peek(offset + 2)
            return closing.kind == "op" and closing.text in (")", "*")
        if after.kind == "op" and after.text == ")":
            following = self.peek(offset + 2)
            starts_operand = following.kind in ("num", "ident", "char", "str") or (
                following.kind == "op" and following.text in ("(", "~", "!", "-", "&")
            )
            return starts_operand and token.text.endswith("_t")
        return False

    def type_name(self) -> str:
        words: list[str] = []
        while True:
            token = self.peek()
            if token.kind == "ident" or (token.kind == "op" and token.text == "*"):
                words.append(self.take().text)
            else:
                break
        if not words:
            raise _ParseError("expected a type name", self.peek().position)
        return " ".join(words)

    def postfix(self) -> _Node:
        start = self.peek().position
        node = self.primary()
        while True:
            if self.at("->") or self.at("."):
                operator = self.take().text
                member = self.take()
                if member.kind != "ident":
                    raise _ParseError("expected a member name", member.position)
                if node.kind == "ident" and node.value == "REC" and operator == "->":
                    node = _Node("field", member.text, (), self.source(start))
                else:
                    raise _ParseError(
                        f"member access {operator}{member.text} of {node.text!r}", member.position
                    )
            elif self.at("["):
                self.take()
                index = self.assignment()
                self.expect("]")
                node = _Node("index", None, (node, index), self.source(start))
            elif self.at("("):
                if node.kind != "ident":
                    raise _ParseError(f"call of {node.text!r}", self.peek().position)
                self.take()
                args: list[_Node] = []
                if not self.at(")"):
                    args.append(self.argument())
                    while self.at(","):
                        self.take()
                        args.append(self.argument())
                self.expect(")")
                node = _Node("call", node.value, tuple(args), self.source(start))
            else:
                return node

    def argument(self) -> _Node:
        if self.at("{"):
            start = self.peek().position
            self.take()
            items: list[_Node] = []
            if not self.at("}"):
                items.append(self.argument())
                while self.at(","):
                    self.take()
                    if self.at("}"):
                        break
                    items.append(self.argument())
            self.expect("}")
            return _Node("braces", None, tuple(items), self.source(start))
        return self.assignment()

    def primary(self) -> _Node:
        token = self.take()
        if token.kind == "num":
            return _Node("num", token.value, (), token.text)
        if token.kind == "char":
            return _Node("num", (token.value, 10, "char"), (), token.text)
        if token.kind == "str":
            return _Node("str", token.value, (), token.text)
        if token.kind == "ident":
            return _Node("ident", token.text, (), token.text)
        if token.kind == "op" and token.text == "(":
            if self.at("{"):
                depth = 0
                while True:
                    inner = self.take()
                    if inner.kind == "end":
                        raise _ParseError("unterminated statement expression", token.position)
                    if inner.kind == "op" and inner.text in ("(", "{"):
                        depth += 1
                    elif inner.kind == "op" and inner.text in (")", "}"):
                        depth -= 1
                        if depth < 0:
                            break
                return _Node("stmt", None, (), self.source(token.position))
            node = self.assignment()
            while self.at(","):
                self.take()
                node = self.assignment()
            self.expect(")")
            return node
        raise _ParseError(f"unexpected {token.text or 'end of text'!r}", token.position)


# ---------------------------------------------------------------------------------------------
# Runtime helpers: the kernel's printing functions, over values from the Event

_SIGN, _LEFT, _PLUS, _SPACE, _ZEROPAD, _SMALL, _SPECIAL = 1, 2, 4, 8, 16, 32, 64
_CHARS = tuple(bytes([b]).decode("utf-8", "surrogateescape") for b in range(256))
_HEX = "0123456789ABCDEF"


def _number(num: int, base: int, flags: int, width: int, precision: int) -> str:
    """lib/vsprintf.c `number()`: `num` is signed when SIGN is set, else unsigned."""
    need_prefix = bool(flags & _SPECIAL) and base != 10
    is_zero = num == 0
    if flags & _LEFT:
        flags &= ~_ZEROPAD
    sign = ""
    if flags & _SIGN:
        if num < 0:
            sign = "-"
            num = -num
            width -= 1
        elif flags & _PLUS:
            sign = "+"
            width -= 1
        elif flags & _SPACE:
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
        digits = format(num, "x" if flags & _SMALL else "X")
    precision = max(precision, len(digits))
    width -= precision
    out: list[str] = []
    if not flags & (_ZEROPAD | _LEFT) and width > 0:
        out.append(" " * width)
        width = 0
    out.append(sign)
    if need_prefix:
        if base == 16 or not is_zero:
            out.append("0")
        if base == 16:
            out.append("x" if flags & _SMALL else "X")
    if not flags & _LEFT and width > 0:
        out.append(("0" if flags & _ZEROPAD else " ") * width)
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


def _string(text: str | None, width: int, precision: int, left: bool) -> str:
    """`string()`: at most `precision` bytes (-1: all), padded to `width` bytes."""
    if text is None:
        return _string("(null)", width, 16 if precision < 0 else precision, left)
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
    if address < 4096 or address >= _MASK64 - 4095:
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


_RUNTIME: dict[str, Any] = {
    "_pf_syscall_argument": _syscall_argument,
    "_pf_kernel_string": _kernel_string,
    "_pf_number": _number,
    "_pf_string": _string,
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


# ---------------------------------------------------------------------------------------------
# Compiler: typed C expressions to Python expressions over `e` (the Event as a tuple)


class _Code(NamedTuple):
    source: str
    type: _CType
    constant: Any = None
    is_constant: bool = False
    text_source: str | None = None  # for a `buf` that is also a decoded string: that string
    lossy: str = ""  # why these bytes may differ from the record's (decoded strings)


class _Unsupported(RingBufferFormatError):
    """One problem in one argument; collected by the compiler, never escapes the module."""


def _wrap(source: str, ctype: _CType) -> str:
    """Python that reduces an unbounded integer to `ctype`'s range (two's complement)."""
    bits = ctype.size * 8
    mask = (1 << bits) - 1
    if not ctype.signed:
        return f"(({source}) & {mask:#x})"
    half = 1 << (bits - 1)
    return f"(((({source}) + {half:#x}) & {mask:#x}) - {half:#x})"


def _wrap_value(value: int, ctype: _CType) -> int:
    bits = ctype.size * 8
    value &= (1 << bits) - 1
    if ctype.signed and value >> (bits - 1):
        value -= 1 << bits
    return value


def _promote(ctype: _CType) -> _CType:
    if ctype.kind == "ptr":
        return _ULONG
    if ctype.boolean or ctype.size < 4:
        return _INT
    return ctype


def _common(left: _CType, right: _CType) -> _CType:
    left, right = _promote(left), _promote(right)
    if left == right:
        return left
    if left.signed == right.signed:
        return left if left.size >= right.size else right
    unsigned, signed = (left, right) if not left.signed else (right, left)
    if unsigned.size >= signed.size:
        return unsigned
    return signed


class _Compiler:
    """Turns one event's print fmt into a `BodyTemplate`-shaped (template, values, helpers)."""

    def __init__(
        self,
        event_format: EventFormat,
        arg_names: Sequence[str],
        context: PrintFmtContext,
    ) -> None:
        self.format = event_format
        self.context = context
        self.symbols = context.symbols
        self.hash_pointers = context.hash_pointers
        self.problems: list[str] = []
        self.helpers: dict[str, Any] = {}
        self.may_fail = False
        self.positions = {name: index for index, name in enumerate(arg_names)}
        self.fields = {f.name: f for f in event_format.all_fields}

    # -- naming constants ---------------------------------------------------------------------

    def helper(self, value: Any, stem: str) -> str:
        name = f"_pf_{stem}{len(self.helpers)}"
        self.helpers[name] = value
        return name

    # -- fields -------------------------------------------------------------------------------

    def field_code(self, name: str, node: _Node) -> _Code:
        found = self.fields.get(name)
        if found is None:
            raise _Unsupported(f"{node.text!r}: the event has no field {name!r}")
        if name == "common_pid":
            return _Code("e[3]", _int(found.size, found.signed))
        if name == "common_flags":
            return _Code("e[9]", _int(found.size, False))
        if name == "common_preempt_count":
            return _Code("e[10]", _int(found.size, False))
        if name == "common_type":
            return _Code(str(self.format.id), _int(2, False), self.format.id, True)
        if name not in self.positions:
            raise _Unsupported(f"{node.text!r}: field {name!r} is not among the event's values")
        source = f"e[8][{self.positions[name]}]"
        if found.is_dynamic:
            raise _Unsupported(
                f"{node.text!r}: the raw __data_loc word of {name!r} (use __get_str or "
                "__get_dynamic_array)"
            )
        element = _field_element_type(found)
        if found.is_array:
            length = found.array_length or 0
            if found.element_type.endswith("char"):
                return _Code(source, _CType("str", found.size, elem=_CHAR), text_source=source)
            if element is not None and length and found.size == element.size * length:
                return _Code(source, _CType("array", found.size, elem=element, count=length))
            return _Code(source, _CType("buf", found.size, elem=_U8))
        if element is None:
            return _Code(source, _CType("buf", found.size, elem=_U8))
        return _Code(source, element)

    def dynamic_field(self, node: _Node, helper: str) -> tuple[FormatField, str]:
        if len(node.children) != 1 or node.children[0].kind != "ident":
            raise _Unsupported(f"{node.text!r}: {helper} takes a field name")
        name = node.children[0].value
        found = self.fields.get(name)
        if found is None:
            raise _Unsupported(f"{node.text!r}: the event has no field {name!r}")
        if not found.is_dynamic:
            raise _Unsupported(f"{node.text!r}: field {name!r} is not a __data_loc/__rel_loc")
        relative = helper.startswith("__get_rel")
        if relative != found.is_rel_loc:
            raise _Unsupported(f"{node.text!r}: {helper} of a field declared {found.type!r}")
        if name not in self.positions:
            raise _Unsupported(f"{node.text!r}: field {name!r} is not among the event's values")
        return found, f"e[8][{self.positions[name]}]"

    # -- expressions --------------------------------------------------------------------------

    def expr(self, node: _Node) -> _Code:
        method = getattr(self, f"expr_{node.kind}")
        code: _Code = method(node)
        return code

    def constant(self, value: Any, ctype: _CType) -> _Code:
        if ctype.kind in ("int", "ptr"):
            value = _wrap_value(int(value), ctype if ctype.kind == "int" else _ULONG)
        return _Code(repr(value), ctype, value, True)

    def expr_num(self, node: _Node) -> _Code:
        value, base, suffix = node.value
        if suffix == "char":
            return self.constant(value if value < 128 else value - 256, _INT)
        unsigned = "u" in suffix
        longs = suffix.count("l")
        if longs:
            ctype = _ULONG if unsigned or value >> 63 else _LONG
        elif unsigned:
            ctype = _UINT if value >> 32 == 0 else _ULONG
        elif value < 1 << 31:
            ctype = _INT
        elif base != 10 and value < 1 << 32:
            ctype = _UINT
        elif value < 1 << 63:
            ctype = _LONG
        else:
            ctype = _ULONG
        return self.constant(value, ctype)

    def expr_str(self, node: _Node) -> _Code:
        text = node.value.decode("utf-8", "surrogateescape").partition("\0")[0]
        return _Code(repr(text), _STR, text, True)

    def expr_ident(self, node: _Node) -> _Code:
        name = node.value
        value = self.context.enum_value(name)
        if value is not None:
            return self.constant(value, _INT if -(1 << 31) <= value < 1 << 31 else _LONG)
        if name in ("true", "false"):
            return self.constant(int(name == "true"), _BOOL)
        if name == "REC":
            raise _Unsupported(f"{node.text!r}: the record itself")
        raise _Unsupported(
            f"identifier {name!r} (a kernel variable, macro or enum the kernel did not resolve "
            "with TRACE_DEFINE_ENUM)"
        )

    def expr_field(self, node: _Node) -> _Code:
        return self.field_code(node.value, node)

    def expr_stmt(self, node: _Node) -> _Code:
        raise _Unsupported(f"GNU statement expression {_shorten(node.text)!r}")

    def expr_deref(self, node: _Node) -> _Code:
        raise _Unsupported(f"{node.text!r}: dereference")

    def expr_braces(self, node: _Node) -> _Code:
        raise _Unsupported(f"{_shorten(node.text)!r}: an initializer list outside __print_*")

    def expr_sizeof(self, node: _Node) -> _Code:
        ctype = self.cast_type(node.value, node)
        if ctype.kind == "int":
            return self.constant(ctype.size, _ULONG)
        if ctype.kind == "ptr":
            return self.constant(8, _ULONG)
        raise _Unsupported(f"{node.text!r}: size of {node.value!r}")

    def expr_sizeof_expr(self, node: _Node) -> _Code:
        operand = node.children[0]
        if operand.kind == "field" and operand.value in self.fields:
            return self.constant(self.fields[operand.value].size, _ULONG)
        raise _Unsupported(f"{node.text!r}: sizeof of an expression")

    def expr_addr(self, node: _Node) -> _Code:
        operand = node.children[0]
        if operand.kind != "field":
            raise _Unsupported(f"{node.text!r}: address of something other than a field")
        code = self.field_code(operand.value, operand)
        if code.type.kind in ("buf",):
            return code
        return self.as_buffer(code, node)

    def expr_index(self, node: _Node) -> _Code:
        base = self.expr(node.children[0])
        index = self.expr(node.children[1])
        if not index.type.is_int:
            raise _Unsupported(f"{node.text!r}: index is not an integer")
        if base.type.kind == "array" and base.type.elem is not None:
            if index.is_constant:
                if not 0 <= index.constant < base.type.count:
                    raise _Unsupported(f"{node.text!r}: index out of the array")
                return _Code(f"{base.source}[{index.constant}]", base.type.elem)
            return _Code(f"{base.source}[{index.source}]", base.type.elem)
        if base.type.kind in ("str", "buf"):
            data = self.exact_buffer(base, node)
            return _Code(_wrap(f"{data.source}[{index.source}]", _CHAR), _CHAR)
        raise _Unsupported(f"{node.text!r}: indexing a {base.type.describe()}")

    def expr_unary(self, node: _Node) -> _Code:
        operand = self.expr(node.children[0])
        op = node.value
        if op == "!":
            truth = self.truth(operand, node)
            return self.fold(f"(0 if {truth} else 1)", _INT, operand)
        if not operand.type.is_int:
            raise _Unsupported(f"{node.text!r}: {op} of a {operand.type.describe()}")
        ctype = _promote(operand.type)
        value = self.convert(operand, ctype, node)
        if op == "+":
            return value
        if op == "-":
            return self.fold(_wrap(f"-{value.source}", ctype), ctype, value)
        if ctype.signed:
            return self.fold(f"(~{value.source})", ctype, value)
        return self.fold(f"({value.source} ^ {(1 << ctype.size * 8) - 1:#x})", ctype, value)

    def expr_binary(self, node: _Node) -> _Code:
        op = node.value
        left = self.expr(node.children[0])
        right = self.expr(node.children[1])
        if op in ("&&", "||"):
            a, b = self.truth(left, node), self.truth(right, node)
            word = "and" if op == "&&" else "or"
            return self.fold(f"(1 if ({a}) {word} ({b}) else 0)", _INT, left, right)
        for side in (left, right):
            if not side.type.is_scalar:
                raise _Unsupported(f"{_shorten(node.text)!r}: {op} on a {side.type.describe()}")
        if op in ("<<", ">>"):
            ctype = _promote(left.type)
            lhs = self.convert(left, ctype, node)
            rhs = self.convert(right, _promote(right.type), node)
            if op == "<<":
                return self.fold(_wrap(f"({lhs.source} << {rhs.source})", ctype), ctype, lhs, rhs)
            return self.fold(f"({lhs.source} >> {rhs.source})", ctype, lhs, rhs)
        if (left.type.kind == "ptr") != (right.type.kind == "ptr") and op in ("+", "-"):
            raise _Unsupported(f"{_shorten(node.text)!r}: pointer arithmetic")
        ctype = _common(left.type, right.type)
        lhs = self.convert(left, ctype, node)
        rhs = self.convert(right, ctype, node)
        if op in ("==", "!=", "<", ">", "<=", ">="):
            return self.fold(f"(1 if {lhs.source} {op} {rhs.source} else 0)", _INT, lhs, rhs)
        if op in ("&", "|", "^"):
            return self.fold(f"({lhs.source} {op} {rhs.source})", ctype, lhs, rhs)
        if op in ("+", "-", "*"):
            return self.fold(_wrap(f"{lhs.source} {op} {rhs.source}", ctype), ctype, lhs, rhs)
        if op in ("/", "%"):
            if rhs.is_constant and rhs.constant == 0:
                raise _Unsupported(f"{_shorten(node.text)!r}: division by zero")
            helper = "_pf_cdiv" if op == "/" else "_pf_cmod"
            self.may_fail = True
            self.helpers[helper] = _c_divide if op == "/" else _c_modulo
            return self.fold(_wrap(f"{helper}({lhs.source}, {rhs.source})", ctype), ctype, lhs, rhs)
        raise _Unsupported(f"operator {op!r}")

    def expr_cond(self, node: _Node) -> _Code:
        condition = self.expr(node.children[0])
        then = self.expr(node.children[1])
        otherwise = self.expr(node.children[2])
        truth = self.truth(condition, node)
        kinds = {then.type.kind, otherwise.type.kind}
        if kinds <= {"int", "ptr"}:
            ctype = _PTR if "ptr" in kinds else _common(then.type, otherwise.type)
            a = self.convert(then, ctype, node)
            b = self.convert(otherwise, ctype, node)
        elif kinds <= {"str", "int", "ptr"}:
            a = self.as_string(then, node)
            b = self.as_string(otherwise, node)
            ctype = _STR
        elif kinds <= {"buf", "array", "str"}:
            a = self.as_buffer(then, node)
            b = self.as_buffer(otherwise, node)
            ctype = a.type
        else:
            raise _Unsupported(f"{_shorten(node.text)!r}: ?: of {sorted(kinds)}")
        if condition.is_constant:
            return a if condition.constant else b
        return _Code(f"({a.source} if {truth} else {b.source})", ctype)

    def expr_cast(self, node: _Node) -> _Code:
        target = self.cast_type(node.value, node)
        operand = self.expr(node.children[0])
        if target.kind == "void":
            raise _Unsupported(f"{node.text!r}: cast to void")
        if target.kind == "ptr":
            if operand.type.kind in ("str", "buf", "array"):
                if target.elem is not None and target.elem.size == 1:
                    return operand
                if operand.type.kind == "str":
                    return operand
                return self.as_buffer(operand, node)
            if operand.type.kind == "ptr":
                return operand._replace(type=target)
            if operand.type.is_int:
                converted = self.convert(operand, _ULONG, node)
                return converted._replace(type=target)
        if target.is_int:
            if operand.type.is_scalar:
                return self.convert(operand, target, node)
            raise _Unsupported(f"{_shorten(node.text)!r}: the address of record data as an integer")
        raise _Unsupported(f"{_shorten(node.text)!r}: cast to {node.value!r}")

    def cast_type(self, text: str, node: _Node) -> _CType:
        words = text.split()
        stars = words.count("*")
        words = [w for w in words if w not in ("*", "const", "volatile")]
        if not words:
            raise _Unsupported(f"{node.text!r}: type {text!r}")
        base: _CType | None
        if words[0] in ("struct", "union"):
            if not stars:
                raise _Unsupported(f"{node.text!r}: cast to {text!r}")
            base = None
        elif words[0] == "enum":
            base = _UINT
        elif words == ["void"]:
            base = _CType("void")
        else:
            base = _BASE_TYPES.get(" ".join(words)) or self.context.typedef(" ".join(words))
            if base is None:
                raise _Unsupported(f"{_shorten(node.text)!r}: unknown type {' '.join(words)!r}")
        if stars or base is None:
            element = base if base is not None and base.kind == "int" and stars == 1 else None
            return _CType("ptr", 8, False, elem=element)
        return base

    def expr_call(self, node: _Node) -> _Code:
        name = node.value
        method = getattr(self, f"call{name}", None)
        if method is None:
            raise _Unsupported(f"function {name}() (kernel code, not evaluated here)")
        code: _Code = method(node)
        return code

    # -- helpers of stage3_trace_output.h -----------------------------------------------------

    def call__get_str(self, node: _Node) -> _Code:
        found, source = self.dynamic_field(node, node.value)
        if not found.element_type.endswith("char"):
            raise _Unsupported(f"{node.text!r}: __get_str of a {found.type!r} field")
        text = f"_pf_cstring({source})"
        return _Code(text, _STR, text_source=text)

    call__get_rel_str = call__get_str

    def call__get_dynamic_array(self, node: _Node) -> _Code:
        found, source = self.dynamic_field(node, node.value)
        element = _parse_element(found.element_type)
        if found.element_type.endswith("char"):
            return _Code(
                f"_pf_string_bytes({source})",
                _CType("buf", 0, elem=element or _U8),
                text_source=f"_pf_cstring({source})",
                lossy=f"the decoder keeps {found.name!r} ({found.type}) as text without its "
                "last byte",
            )
        return _Code(source, _CType("buf", 0, elem=element or _U8))

    call__get_rel_dynamic_array = call__get_dynamic_array
    call__get_sockaddr = call__get_dynamic_array
    call__get_rel_sockaddr = call__get_dynamic_array

    def call__get_dynamic_array_len(self, node: _Node) -> _Code:
        _, source = self.dynamic_field(node, node.value)
        return _Code(f"_pf_dynamic_length({source})", _UINT)

    call__get_rel_dynamic_array_len = call__get_dynamic_array_len

    def call__get_bitmask(self, node: _Node) -> _Code:
        _, source = self.dynamic_field(node, node.value)
        return _Code(f"_pf_bitmask({source})", _STR)

    call__get_cpumask = call__get_bitmask
    call__get_rel_bitmask = call__get_bitmask
    call__get_rel_cpumask = call__get_bitmask

    def call__print_flags(self, node: _Node) -> _Code:
        if len(node.children) < 2:
            raise _Unsupported(f"{_shorten(node.text)!r}: __print_flags needs value, delimiter")
        value = self.convert(self.expr(node.children[0]), _ULONG, node)
        delimiter = self.expr(node.children[1])
        if not delimiter.is_constant or delimiter.type.kind not in ("str", "int", "ptr"):
            raise _Unsupported(f"{_shorten(node.text)!r}: delimiter is not a string literal")
        separator = delimiter.constant if delimiter.type.kind == "str" else None
        if separator is None and delimiter.constant != 0:
            raise _Unsupported(f"{_shorten(node.text)!r}: delimiter is not a string")
        table = tuple(self.flag_table(node.children[2:], node))
        name = self.helper(table, "flags")
        return self.fold(f"_pf_flags({value.source}, {separator!r}, {name})", _STR, value)

    call__print_flags_u64 = call__print_flags

    def call__print_symbolic(self, node: _Node) -> _Code:
        if not node.children:
            raise _Unsupported(f"{_shorten(node.text)!r}: __print_symbolic needs a value")
        value = self.convert(self.expr(node.children[0]), _ULONG, node)
        symbols: dict[int, str] = {}
        for mask, label in self.flag_table(node.children[1:], node):
            symbols.setdefault(mask, label)
        name = self.helper(symbols, "symbols")
        return self.fold(f"_pf_symbolic({value.source}, {name})", _STR, value)

    call__print_symbolic_u64 = call__print_symbolic

    def flag_table(self, items: Sequence[_Node], node: _Node) -> Iterable[tuple[int, str]]:
        for item in items:
            if item.kind == "braces" and not item.children:
                return
            if item.kind != "braces" or len(item.children) != 2:
                raise _Unsupported(f'{_shorten(item.text)!r}: expected {{ value, "name" }}')
            mask = self.expr(item.children[0])
            label = self.expr(item.children[1])
            if not mask.is_constant or not mask.type.is_scalar:
                raise _Unsupported(f"{_shorten(item.text)!r}: value is not a constant")
            if label.is_constant and label.type.kind in ("int", "ptr") and label.constant == 0:
                return
            if not label.is_constant or label.type.kind != "str":
                raise _Unsupported(f"{_shorten(item.text)!r}: name is not a string literal")
            yield _wrap_value(mask.constant, _ULONG), label.constant

    def call__print_hex(self, node: _Node) -> _Code:
        return self.hex_call(node, concatenate=False)

    def call__print_hex_str(self, node: _Node) -> _Code:
        return self.hex_call(node, concatenate=True)

    def hex_call(self, node: _Node, *, concatenate: bool) -> _Code:
        if len(node.children) != 2:
            raise _Unsupported(f"{_shorten(node.text)!r}: expected (buffer, length)")
        data = self.exact_buffer(self.expr(node.children[0]), node)
        length = self.convert(self.expr(node.children[1]), _INT, node)
        self.may_fail = True
        return _Code(f"_pf_print_hex({data.source}, {length.source}, {concatenate})", _STR)

    def call__print_array(self, node: _Node) -> _Code:
        if len(node.children) != 3:
            raise _Unsupported(f"{_shorten(node.text)!r}: expected (array, count, el_size)")
        data = self.exact_buffer(self.expr(node.children[0]), node)
        count = self.convert(self.expr(node.children[1]), _INT, node)
        size = self.expr(node.children[2])
        if not size.is_constant or size.constant not in (1, 2, 4, 8):
            raise _Unsupported(f"{_shorten(node.text)!r}: element size is not 1, 2, 4 or 8")
        self.may_fail = True
        return _Code(f"_pf_print_array({data.source}, {count.source}, {size.constant})", _STR)

    def call__print_dynamic_array(self, node: _Node) -> _Code:
        if len(node.children) != 2 or node.children[0].kind != "ident":
            raise _Unsupported(f"{_shorten(node.text)!r}: expected (field, el_size)")
        found, source = self.dynamic_field(
            _Node("call", "x", node.children[:1], node.text), "__get"
        )
        if found.element_type.endswith("char"):
            raise _Unsupported(
                f"{_shorten(node.text)!r} printed as bytes: the decoder keeps {found.name!r} "
                f"({found.type}) as text without its last byte"
            )
        size = self.expr(node.children[1])
        if not size.is_constant or size.constant not in (1, 2, 4, 8):
            raise _Unsupported(f"{_shorten(node.text)!r}: element size is not 1, 2, 4 or 8")
        count = f"_pf_dynamic_length({source}) // {size.constant}"
        self.may_fail = True
        return _Code(f"_pf_print_array({source}, {count}, {size.constant})", _STR)

    def call__print_ns_to_secs(self, node: _Node) -> _Code:
        value = self.convert(self.single(node), _ULONG, node)
        return self.fold(f"({value.source} // 1000000000)", _ULONG, value)

    def call__print_ns_without_secs(self, node: _Node) -> _Code:
        value = self.convert(self.single(node), _ULONG, node)
        return self.fold(f"({value.source} % 1000000000)", _UINT, value)

    def call__builtin_expect(self, node: _Node) -> _Code:
        if len(node.children) != 2:
            raise _Unsupported(f"{node.text!r}: __builtin_expect takes two arguments")
        return self.expr(node.children[0])

    def single(self, node: _Node) -> _Code:
        if len(node.children) != 1:
            raise _Unsupported(f"{_shorten(node.text)!r}: expected one argument")
        return self.expr(node.children[0])

    # -- conversions --------------------------------------------------------------------------

    def fold(self, source: str, ctype: _CType, *inputs: _Code) -> _Code:
        if all(i.is_constant for i in inputs):
            namespace = dict(_RUNTIME)
            namespace.update(self.helpers)
            namespace["_pf_cdiv"], namespace["_pf_cmod"] = _c_divide, _c_modulo
            value = eval(source, namespace)
            if ctype.kind == "str":
                return _Code(repr(value), ctype, value, True)
            return self.constant(value, ctype)
        return _Code(source, ctype)

    def convert(self, code: _Code, target: _CType, node: _Node) -> _Code:
        if code.type.kind == "ptr":
            source_type = _ULONG
        elif code.type.is_int:
            source_type = code.type
        else:
            raise _Unsupported(
                f"{_shorten(node.text)!r}: a {code.type.describe()} used as an integer"
            )
        if target.boolean:
            if source_type.boolean:
                return code._replace(type=target)
            return self.fold(f"(1 if {code.source} else 0)", target, code)
        if source_type == target or (
            source_type.size <= target.size
            and (
                source_type.signed == target.signed
                or (target.signed and source_type.size < target.size)
                or source_type.boolean
            )
        ):
            if code.is_constant:
                return self.constant(code.constant, target)
            return code._replace(type=target)
        if code.is_constant:
            return self.constant(code.constant, target)
        return _Code(_wrap(code.source, target), target)

    def truth(self, code: _Code, node: _Node) -> str:
        if code.type.kind in ("str", "buf", "array"):
            return "True"
        if code.is_constant:
            return "True" if code.constant else "False"
        return code.source

    def as_string(self, code: _Code, node: _Node) -> _Code:
        if code.type.kind == "str":
            return code
        if code.text_source is not None:
            return _Code(code.text_source, _STR)
        if code.type.kind == "buf":
            return _Code(f"_pf_buffer_string({code.source})", _STR)
        if code.type.kind in ("int", "ptr") and code.is_constant and code.constant == 0:
            return _Code(repr("(null)"), _STR, "(null)", True)
        if code.type.kind in ("int", "ptr") and self.context.strings is not None:
            address = self.convert(code, _ULONG, node)
            table = self.helper(self.context.strings, "strings")
            self.may_fail = True
            return _Code(f"_pf_kernel_string({address.source}, {table})", _STR)
        raise _Unsupported(
            f"{_shorten(node.text)!r}: %s of a {code.type.describe()} (the kernel reads a "
            "string from kernel memory, which the record does not hold)"
        )

    def as_buffer(self, code: _Code, node: _Node) -> _Code:
        ctype = code.type
        if ctype.kind == "buf":
            return code
        if ctype.kind == "array" and ctype.elem is not None:
            return _Code(
                f"_pf_pack({code.source}, {ctype.elem.size})",
                _CType("buf", ctype.size, elem=ctype.elem),
            )
        if ctype.kind == "str":
            return _Code(
                f"_pf_string_bytes({code.source}, {ctype.size})",
                _CType("buf", ctype.size, elem=_CHAR),
                text_source=code.source,
                lossy="the decoder keeps char arrays and strings only up to their first NUL",
            )
        if ctype.kind == "int" and node.kind == "addr":
            size = ctype.size
            return _Code(
                f"({code.source} & {(1 << size * 8) - 1:#x}).to_bytes({size}, 'little')",
                _CType("buf", size, elem=ctype),
            )
        raise _Unsupported(
            f"{_shorten(node.text)!r}: a {ctype.describe()} used as a pointer to data (kernel "
            "memory, which the record does not hold)"
        )

    def exact_buffer(self, code: _Code, node: _Node) -> _Code:
        """`as_buffer` for consumers that print raw bytes: refuses bytes rebuilt from text."""
        data = self.as_buffer(code, node)
        if data.lossy:
            raise _Unsupported(f"{_shorten(node.text)!r} printed as bytes: {data.lossy}")
        return data


def _c_divide(left: int, right: int) -> int:
    if right == 0:
        raise RingBufferFormatError("print fmt divides by zero for this record")
    quotient = abs(left) // abs(right)
    return quotient if (left < 0) == (right < 0) else -quotient


def _c_modulo(left: int, right: int) -> int:
    return left - right * _c_divide(left, right)


def _shorten(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_element(type_text: str) -> _CType | None:
    words = [w for w in type_text.replace("*", " * ").split() if w not in ("const", "volatile")]
    if "*" in words:
        return _PTR
    return _BASE_TYPES.get(" ".join(words))


def _field_element_type(found: FormatField) -> _CType | None:
    """The C type of a scalar field or of one array element, from size and signedness."""
    text = found.element_type if found.is_dynamic else found.type
    if "*" in text:
        return _PTR
    words = [w for w in text.split() if w not in ("const", "volatile")]
    length = found.array_length or 0
    size = found.size // length if found.is_array and length else found.size
    if size not in (1, 2, 4, 8):
        return None
    if words and words[0] in ("struct", "union"):
        return None
    if " ".join(words) in ("bool", "_Bool"):
        return _CType("int", size, False, boolean=True)
    return _int(size, found.signed)


# ---------------------------------------------------------------------------------------------
# printf: the kernel's format_decode, one conversion at a time


@dataclass(frozen=True)
class _Conversion:
    text: str
    flags: int
    width: int | None  # None: taken from an argument (`*`)
    precision: int | None
    qualifier: str
    conversion: str  # d i u o x X c s p %, or "" for an invalid one (printing stops there)
    extension: str = ""  # the alphanumerics after %p


def _decode_format(text: str) -> list[str | _Conversion]:
    """Literal runs and conversions, in order, as `format_decode` reads them."""
    pieces: list[str | _Conversion] = []
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
            flags |= {"-": _LEFT, "+": _PLUS, " ": _SPACE, "#": _SPECIAL, "0": _ZEROPAD}[
                text[index]
            ]
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
            pieces.append(_Conversion(text[start:index], flags, width, precision, qualifier, ""))
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
            flags |= _SIGN
        if conversion == "x":
            flags |= _SMALL
        pieces.append(
            _Conversion(
                text[start:index], flags, width, precision, qualifier, conversion, extension
            )
        )
    return pieces


_QUALIFIER_SIZE = {"H": 1, "h": 2, "": 4, "l": 8, "L": 8, "z": 8, "t": 8}


class _Template:
    """A %-format and the expressions that fill it."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.values: list[str] = []

    def literal(self, text: str) -> None:
        self.parts.append(text.replace("%", "%%"))

    def conversion(self, python_format: str, value: str) -> None:
        self.parts.append(python_format)
        self.values.append(value)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class _PrintfCompiler:
    """Lowers each printf conversion of a print fmt, with its arguments, into the template."""

    def __init__(self, compiler: _Compiler, args: Sequence[_Node]) -> None:
        self.compiler = compiler
        self.args = list(args)
        self.next_arg = 0
        self.template = _Template()

    def take(self, conversion: _Conversion) -> tuple[_Node, _Code] | None:
        if self.next_arg >= len(self.args):
            self.compiler.problems.append(
                f"{conversion.text!r} has no argument (the print fmt has {len(self.args)})"
            )
            return None
        node = self.args[self.next_arg]
        self.next_arg += 1
        try:
            return node, self.compiler.expr(node)
        except _Unsupported as problem:
            self.compiler.problems.append(str(problem))
            return None

    def run(self, text: str) -> None:
        for piece in _decode_format(text):
            if isinstance(piece, str):
                self.template.literal(piece)
                continue
            if not piece.conversion:
                return
            if piece.conversion == "%":
                self.template.literal("%")
                continue
            try:
                self.lower(piece)
            except _Unsupported as problem:
                self.compiler.problems.append(str(problem))

    def star(self, conversion: _Conversion) -> str | None:
        taken = self.take(conversion)
        if taken is None:
            return None
        node, code = taken
        return self.compiler.convert(code, _INT, node).source

    def lower(self, spec: _Conversion) -> None:
        width_source = str(spec.width) if spec.width is not None else self.star(spec)
        precision_source = str(spec.precision) if spec.precision is not None else None
        if spec.precision is None:
            taken_precision = self.star(spec)
            precision_source = None if taken_precision is None else f"max({taken_precision}, 0)"
        taken = self.take(spec)
        if taken is None or width_source is None or precision_source is None:
            return
        node, code = taken
        flags = spec.flags
        if spec.width is None:
            left = f"({flags & _LEFT} or {width_source} < 0)"
            width_source = f"abs({width_source})"
            flags_source = f"({flags} | ({_LEFT} if {left} else 0))"
        else:
            flags_source = str(flags)
        if spec.conversion == "s":
            self.lower_string(spec, node, code, width_source, precision_source, flags_source)
        elif spec.conversion == "c":
            value = self.compiler.convert(code, _promote(code.type), node)
            left = f"bool({flags_source} & {_LEFT})"
            if spec.width is not None and spec.width <= 1:
                self.template.conversion("%s", f"_pf_chars[{value.source} & 255]")
            else:
                self.template.conversion("%s", f"_pf_char({value.source}, {width_source}, {left})")
        elif spec.conversion == "p":
            self.lower_pointer(spec, node, code, width_source, precision_source, flags_source)
        else:
            self.lower_number(spec, node, code, width_source, precision_source, flags_source)

    def lower_number(
        self,
        spec: _Conversion,
        node: _Node,
        code: _Code,
        width: str,
        precision: str,
        flags: str,
    ) -> None:
        if not code.type.is_scalar:
            raise _Unsupported(
                f"{_shorten(node.text)!r}: {spec.text} of a {code.type.describe()} (an address "
                "of record data)"
            )
        argument = _promote(code.type)
        value = self.compiler.convert(code, argument, node)
        size = _QUALIFIER_SIZE[spec.qualifier]
        signed = bool(spec.flags & _SIGN)
        target = _int(size, signed)
        if argument.size < size:
            value = self.compiler.convert(value, _int(argument.size, False), node)
            value = value._replace(type=_int(size, False))
        value = self.compiler.convert(value, target, node)
        base = {"o": 8, "x": 16, "X": 16}.get(spec.conversion, 10)
        simple = (
            spec.precision == -1
            and not (spec.flags & _SPECIAL and base == 8)
            and not (not signed and spec.flags & (_PLUS | _SPACE))
        )
        if simple and spec.width is not None:
            letter = {"o": "o", "x": "x", "X": "X"}.get(spec.conversion, "d")
            python = "%" + _python_flags(spec.flags) + (str(spec.width) if spec.width > 0 else "")
            self.template.conversion(python + letter, value.source)
            return
        self.template.conversion(
            "%s", f"_pf_number({value.source}, {base}, {flags}, {width}, {precision})"
        )

    def lower_string(
        self,
        spec: _Conversion,
        node: _Node,
        code: _Code,
        width: str,
        precision: str,
        flags: str,
    ) -> None:
        text = self.compiler.as_string(code, node)
        if spec.width == -1 and spec.precision == -1:
            if text.is_constant:
                self.template.literal(text.constant)
            else:
                self.template.conversion("%s", text.source)
            return
        left = f"bool({flags} & {_LEFT})"
        self.template.conversion("%s", f"_pf_string({text.source}, {width}, {precision}, {left})")

    def lower_pointer(
        self,
        spec: _Conversion,
        node: _Node,
        code: _Code,
        width: str,
        precision: str,
        flags: str,
    ) -> None:
        extension = spec.extension
        letter = extension[:1]
        left = f"bool({flags} & {_LEFT})"
        compiler = self.compiler
        if letter in ("S", "s", "B"):
            if not code.type.is_scalar:
                raise _Unsupported(f"{_shorten(node.text)!r}: %p{extension} of record data")
            if compiler.symbols is None:
                raise _Unsupported(
                    f"%p{extension} of {_shorten(node.text)!r} needs the kernel's symbols "
                    "(pass symbols=KernelSymbols.load())"
                )
            address = compiler.convert(code, _ULONG, node)
            symbols = compiler.helper(compiler.symbols, "kallsyms")
            call = (
                f"{symbols}.symbol({address.source}, offset={letter != 's'}, "
                f"backtrace={letter == 'B'})"
            )
            self.string_piece(spec, call, width, precision, left)
            return
        if letter == "x" or (letter == "" and not compiler.hash_pointers and spec.text == "%p"):
            if not code.type.is_scalar:
                raise _Unsupported(f"{_shorten(node.text)!r}: %p of record data")
            address = compiler.convert(code, _ULONG, node)
            if spec.width == -1 and not spec.flags:
                self.template.conversion("%016x", address.source)
            elif spec.width == -1:
                self.template.conversion(
                    "%s", f"_pf_number({address.source}, 16, {flags} | {_SMALL | _ZEROPAD}, 16, -1)"
                )
            else:
                self.template.conversion(
                    "%s", f"_pf_number({address.source}, 16, {flags} | {_SMALL}, {width}, -1)"
                )
            return
        if letter == "":
            reason = (
                "the instance hashes pointers (options/hash-ptr is on)"
                if compiler.hash_pointers
                else "the kernel hashes %p with flags or a width"
            )
            raise _Unsupported(f"%p of {_shorten(node.text)!r}: {reason}")
        if letter in ("M", "m", "I", "i", "U", "h", "b"):
            data = compiler.exact_buffer(code, node)
            compiler.may_fail = True
            if letter in ("M", "m"):
                call = f"_pf_mac({data.source}, {extension!r})"
            elif letter in ("I", "i"):
                if extension[1:2] not in ("4", "6", "S"):
                    call = repr(f"(%p{letter}?)")
                else:
                    call = f"_pf_ip({data.source}, {extension!r})"
            elif letter == "U":
                call = f"_pf_uuid({data.source}, {extension!r})"
            elif letter == "h":
                separator = {"C": ":", "D": "-", "N": ""}.get(extension[1:2], " ")
                self.template.conversion(
                    "%s", f"_pf_hex_string({data.source}, {width}, {separator!r})"
                )
                return
            else:
                helper = "_pf_bitmap_list" if extension[1:2] == "l" else "_pf_bitmap"
                self.template.conversion("%s", f"{helper}({data.source}, {width})")
                return
            self.string_piece(spec, call, width, precision, left)
            return
        raise _Unsupported(
            f"%p{extension} of {_shorten(node.text)!r} (reads kernel memory or state)"
        )

    def string_piece(
        self, spec: _Conversion, call: str, width: str, precision: str, left: str
    ) -> None:
        if spec.width == -1 and spec.precision == -1:
            self.template.conversion("%s", call)
        else:
            self.template.conversion("%s", f"_pf_string({call}, {width}, {precision}, {left})")


def _python_flags(flags: int) -> str:
    return "".join(
        letter
        for bit, letter in ((_LEFT, "-"), (_PLUS, "+"), (_SPACE, " "), (_SPECIAL, "#"))
        if flags & bit
    ) + ("0" if flags & _ZEROPAD and not flags & _LEFT else "")


# ---------------------------------------------------------------------------------------------
# Public API


@dataclass(frozen=True)
class CompiledPrintFmt:
    """An event's print fmt as a %-`template` filled by Python `values` over `e` (the Event as
    a tuple) with `helpers` in scope: the shape of the text sink's `BodyTemplate`."""

    event_format: EventFormat
    template: str
    values: tuple[str, ...]
    helpers: Mapping[str, Any] = field(default_factory=dict)
    may_fail: bool = False
    """Whether a record can hold what the print fmt cannot print (a buffer shorter than the
    length it prints, a kernel string not in printk_formats, a division by zero): printing
    such a record raises `RingBufferFormatError`."""
    named: bool = True
    """False for events whose kernel printer does not start with `NAME: ` (syscalls)."""

    def function(self) -> Printer:
        """The text after `NAME: ` (all of it for syscalls) as a function of the event."""
        namespace: dict[str, Any] = dict(_RUNTIME)
        namespace.update(self.helpers)
        values = "".join(f"{value}, " for value in self.values)
        source = f"def render(e):\n    return {self.template!r} % ({values})\n"
        label = self.event_format.label
        exec(compile(source, f"<probescope print fmt {label}>", "exec"), namespace)
        render: Printer = namespace["render"]
        return render

    def body(self, name: str) -> BodyTemplate:
        """The whole event text, `NAME: ...`, as the text sink's `BodyTemplate`."""
        helpers: dict[str, Any] = dict(_RUNTIME)
        helpers.update(self.helpers)
        prefix = name.replace("%", "%%") + ": " if self.named else ""
        return BodyTemplate(prefix + self.template, self.values, helpers)


def compile_print_fmt(
    event_format: EventFormat,
    event_type: EventType | None = None,
    context: PrintFmtContext | None = None,
) -> CompiledPrintFmt:
    """Compile `event_format.print_fmt` for Events of `event_type`, whose `args` hold the
    format's fields by name (default: all fields in format order, as `EventDecoder` gives
    them). Raises `PrintFmtError` listing every construct that cannot be reproduced."""
    context = context or PrintFmtContext()
    arg_names = (
        event_type.arg_names if event_type is not None else [f.name for f in event_format.fields]
    )
    if event_format.system == "syscalls":
        return _compile_syscall(event_format, arg_names)
    compiler = _Compiler(event_format, arg_names, context)
    label = event_format.label
    if not event_format.print_fmt:
        raise PrintFmtError(label, ["the format has no print fmt"])
    offset = 0
    try:
        text, rest, offset = _split_print_fmt(event_format.print_fmt)
        typedefs = dict(_BASE_TYPES)
        if context.types is not None:
            typedefs.update((name, _INT) for name in context.types.typedefs)
        args = _Parser(rest, typedefs).parse_arguments()
    except _ParseError as error:
        where = error.position + offset
        snippet = event_format.print_fmt.strip()[max(where - 20, 0) : where + 20]
        raise PrintFmtError(
            label,
            [f"cannot parse {error} at column {where + 1}: ...{snippet}..."],
            print_fmt=event_format.print_fmt,
        ) from None
    printf = _PrintfCompiler(compiler, args)
    printf.run(text)
    if compiler.problems:
        raise PrintFmtError(label, compiler.problems, print_fmt=event_format.print_fmt)
    return CompiledPrintFmt(
        event_format,
        printf.template.text,
        tuple(printf.template.values),
        compiler.helpers,
        compiler.may_fail,
    )


def _compile_syscall(event_format: EventFormat, arg_names: Sequence[str]) -> CompiledPrintFmt:
    """`print_syscall_enter`/`print_syscall_exit` (kernel/trace/trace_syscalls.c), which `trace`
    uses instead of the print fmt: `sys_NAME(arg: VALUE, ...)` with values under 10 in decimal
    and the others as `0x%lx` (Linux 6.18; older kernels printed `%lx`), and `sys_NAME -> 0x%lx`.
    Events that also record user-space strings (`__ARG_val` fields, newer kernels) are refused,
    as is the `verbose` option's output (argument types)."""
    label = event_format.label
    name = event_format.name
    fields = [f.name for f in event_format.fields]
    missing = [f for f in fields if f not in arg_names]
    if missing:
        raise PrintFmtError(label, [f"fields {missing} are not among the event's values"])
    wide = all(f.size == 8 and not f.is_dynamic for f in event_format.fields[1:])
    if not fields or fields[0] != "__syscall_nr" or not wide:
        raise PrintFmtError(
            label,
            [
                f"a syscall event with fields {fields} (newer kernels add user-space strings "
                "that `trace` prints its own way)"
            ],
        )
    values = [f"(e[8][{arg_names.index(f)}] & {_MASK64:#x})" for f in fields[1:]]
    call = "sys_" + name.split("_", 2)[-1]
    if name.startswith("sys_enter_"):
        arguments = ", ".join(field.replace("%", "%%") + ": %s" for field in fields[1:])
        template = call.replace("%", "%%") + "(" + arguments + ")"
        values = [f"_pf_syscall_argument{value}" for value in values]
        return CompiledPrintFmt(event_format, template, tuple(values), named=False)
    if name.startswith("sys_exit_") and fields[1:] == ["ret"]:
        template = call.replace("%", "%%") + " -> 0x%x"
        return CompiledPrintFmt(event_format, template, tuple(values), named=False)
    raise PrintFmtError(label, [f"a syscall event named {name!r} with fields {fields}"])


def tracepoint_printer(
    event_type: EventType,
    event_format: EventFormat,
    context: PrintFmtContext | None = None,
    *,
    fallback: bool = False,
) -> Printer:
    """The whole event text as `trace` prints it: `NAME: ` and the evaluated print fmt.

    With `fallback`, a print fmt that cannot be reproduced, or a record it cannot print (see
    `CompiledPrintFmt.may_fail`), gives `NAME: <print fmt not reproduced> FIELD=VALUE ...`
    instead of raising `PrintFmtError`/`RingBufferFormatError`.
    """
    body = _body(event_type, event_format, context, fallback)
    return body.compile(event_format.label) if isinstance(body, BodyTemplate) else body


@functools.cache
def _running_kernel_context(hash_pointers: bool, tracefs: str) -> PrintFmtContext:
    try:
        strings: dict[int, str] | None = parse_printk_formats(
            (Path(tracefs) / "printk_formats").read_text("utf-8", "surrogateescape")
        )
    except OSError:
        strings = None
    return PrintFmtContext(hash_pointers, kernel_symbols(), _kernel_types(), strings=strings)


@functools.cache
def _kernel_types() -> KernelTypes | None:
    return KernelTypes.load()


def _body(
    event_type: EventType,
    event_format: EventFormat,
    context: PrintFmtContext | None,
    fallback: bool,
) -> BodyTemplate | Printer:
    try:
        compiled = compile_print_fmt(event_format, event_type, context)
    except PrintFmtError:
        if not fallback:
            raise
        return _fallback_printer(event_type)
    body = compiled.body(event_type.name)
    if not (fallback and compiled.may_fail):
        return body
    exact = body.compile(event_format.label)
    instead = _fallback_printer(event_type)

    def guarded(event: Event) -> str:
        try:
            return exact(event)
        except RingBufferFormatError:
            return instead(event)

    return guarded


def _fallback_printer(event_type: EventType) -> Printer:
    prefix = f"{event_type.name}: {NOT_REPRODUCED}"
    names = event_type.arg_names

    def body(event: Event) -> str:
        parts = [prefix]
        for name, value in zip(names, event.args, strict=False):
            if isinstance(value, bytes):
                value = value.hex()
            elif isinstance(value, tuple):
                value = "{" + ",".join(str(v) for v in value) + "}"
            parts.append(f"{name}={value}")
        return " ".join(parts)

    return body


class _Registration(NamedTuple):
    event_format: EventFormat
    context: PrintFmtContext | None
    fallback: bool


_REGISTERED: weakref.WeakKeyDictionary[EventType, _Registration] = weakref.WeakKeyDictionary()


def register_tracepoint(
    event_type: EventType,
    event_format: EventFormat,
    context: PrintFmtContext | None = None,
    *,
    fallback: bool = False,
) -> None:
    """Make the text sink print Events of `event_type` as `trace` does, from this format.

    Compiles now, so an unsupported print fmt raises `PrintFmtError` here rather than in the
    middle of a stream, unless `fallback` is set (see `tracepoint_printer`).
    """
    if not fallback:
        compile_print_fmt(event_format, event_type, context)
    _REGISTERED[event_type] = _Registration(event_format, context, fallback)


def registered_body(event_type: EventType) -> BodyTemplate | Printer | None:
    """The text of a tracepoint event type given to `register_tracepoint` (a `BodyTemplate`,
    or a printer where the fallback may be needed), None when it was not registered."""
    registration = _REGISTERED.get(event_type)
    if registration is None:
        return None
    return _body(event_type, registration.event_format, registration.context, registration.fallback)
