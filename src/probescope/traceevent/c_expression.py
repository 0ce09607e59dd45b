"""C expressions as they appear after `print fmt:`: a lexer and a parser into `CNode` trees.

The arguments of a TP_printk are `__stringify`'d C source after the preprocessor: field reads
(`REC->prev_pid`), arithmetic, casts, `?:`, calls of the trace output helpers (`__get_str`,
`__print_flags` with brace tables) and now and then a GNU statement expression. The parser
keeps every node's source text so that problems can quote it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from probescope.errors import RingBufferFormatError
from probescope.traceevent.c_types import TYPE_WORDS, CType


class Token(NamedTuple):
    """One C token: its kind, its text, its value (numbers: (value, base, suffix); strings:
    bytes) and where it starts in the text."""

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


class CParseError(RingBufferFormatError):
    """Text after `print fmt:` that is not C; `position` is where. The print fmt compiler
    turns it into a `PrintFmtError` naming the event."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


def _lex(text: str) -> list[Token]:
    tokens: list[Token] = []
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
                    tokens.append(Token("str", text[last.position : end], data, last.position))
                else:
                    tokens.append(Token("str", text[index:end], data, index))
            else:
                if len(data) != 1:
                    raise CParseError(f"character constant {text[index:end]!r}", index)
                tokens.append(Token("char", text[index:end], data[0], index))
            index = end
            continue
        if ch.isdigit():
            match = _NUMBER.match(text, index)
            if match is None:
                raise CParseError(f"number at {text[index : index + 10]!r}", index)
            digits, suffix = match.group(1), match.group(2)
            end = match.end()
            if end < len(text) and (text[end].isalnum() or text[end] in "._"):
                raise CParseError(f"number {text[index : end + 1]!r}", index)
            if digits.startswith(("0x", "0X")):
                value, base = int(digits, 16), 16
            elif len(digits) > 1 and digits.startswith("0"):
                if any(d in "89" for d in digits):
                    raise CParseError(f"octal number {digits!r}", index)
                value, base = int(digits, 8), 8
            else:
                value, base = int(digits, 10), 10
            tokens.append(Token("num", text[index:end], (value, base, suffix.lower()), index))
            index = end
            continue
        match = _IDENT.match(text, index)
        if match:
            tokens.append(Token("ident", match.group(0), match.group(0), index))
            index = match.end()
            continue
        for punct in _PUNCTUATION:
            if text.startswith(punct, index):
                tokens.append(Token("op", punct, punct, index))
                index += len(punct)
                break
        else:
            raise CParseError(f"character {ch!r}", index)
    tokens.append(Token("end", "", None, len(text)))
    return tokens


def _lex_quoted(text: str, start: int) -> tuple[bytes, int]:
    quote = text[start]
    data = bytearray()
    index = start + 1
    while True:
        if index >= len(text):
            raise CParseError("unterminated quote", start)
        ch = text[index]
        if ch == quote:
            return bytes(data), index + 1
        if ch != "\\":
            data += ch.encode("utf-8", "surrogateescape")
            index += 1
            continue
        if index + 1 >= len(text):
            raise CParseError("unterminated escape", index)
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
                raise CParseError("\\x without hex digits", index)
            data.append(int(text[index + 2 : end], 16) & 0xFF)
            index = end
        else:
            raise CParseError(f"escape \\{nxt}", index)


@dataclass(frozen=True)
class CNode:
    """One node of a parsed C expression; `text` is its source, for messages."""

    kind: str  # num str field ident call cast sizeof unary binary cond braces index addr stmt
    value: Any = None
    children: tuple[CNode, ...] = ()
    text: str = ""


_BINARY_PRECEDENCE = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
    "<": 7, ">": 7, "<=": 7, ">=": 7, "<<": 8, ">>": 8,
    "+": 9, "-": 9, "*": 10, "/": 10, "%": 10,
}  # fmt: skip


class CParser:
    """A recursive-descent parser of the argument list after `print fmt:`'s string: C
    expressions with casts (types from `typedefs` and the base types), calls, `REC->field`,
    brace lists (`__print_flags` tables) and GNU statement expressions (kept as text)."""

    def __init__(self, text: str, typedefs: Mapping[str, CType]) -> None:
        self.text = text
        self.tokens = _lex(text)
        self.index = 0
        self.typedefs = typedefs

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.index + offset, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, text: str) -> Token:
        token = self.peek()
        if token.kind != "op" or token.text != text:
            raise CParseError(
                f"expected {text!r}, found {token.text or 'the end'!r}", token.position
            )
        return self.take()

    def at(self, text: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text == text

    def parse_arguments(self) -> list[CNode]:
        args: list[CNode] = []
        while self.at(","):
            self.take()
            args.append(self.assignment())
        if self.peek().kind != "end":
            token = self.peek()
            raise CParseError(f"unexpected {token.text!r}", token.position)
        return args

    def source(self, start: int) -> str:
        end = self.tokens[self.index - 1]
        return self.text[start : end.position + len(end.text)].strip()

    def assignment(self) -> CNode:
        start = self.peek().position
        node = self.conditional()
        if self.at("="):
            raise CParseError("assignment", self.peek().position)
        return CNode(node.kind, node.value, node.children, node.text or self.source(start))

    def conditional(self) -> CNode:
        start = self.peek().position
        condition = self.binary(1)
        if not self.at("?"):
            return condition
        self.take()
        then = self.assignment()
        self.expect(":")
        otherwise = self.conditional()
        return CNode("cond", None, (condition, then, otherwise), self.source(start))

    def binary(self, level: int) -> CNode:
        start = self.peek().position
        left = self.unary()
        while True:
            token = self.peek()
            precedence = _BINARY_PRECEDENCE.get(token.text) if token.kind == "op" else None
            if precedence is None or precedence < level:
                return left
            self.take()
            right = self.binary(precedence + 1)
            left = CNode("binary", token.text, (left, right), self.source(start))

    def unary(self) -> CNode:
        start = self.peek().position
        token = self.peek()
        if token.kind == "op" and token.text in ("-", "+", "!", "~"):
            self.take()
            operand = self.unary()
            return CNode("unary", token.text, (operand,), self.source(start))
        if token.kind == "op" and token.text == "&":
            self.take()
            operand = self.unary()
            return CNode("addr", None, (operand,), self.source(start))
        if token.kind == "op" and token.text == "*":
            self.take()
            operand = self.unary()
            return CNode("deref", None, (operand,), self.source(start))
        if token.kind == "op" and token.text in ("++", "--"):
            raise CParseError(f"{token.text} operator", token.position)
        if token.kind == "ident" and token.text == "sizeof":
            self.take()
            if self.at("(") and self.is_type_start(1):
                self.take()
                type_name = self.type_name()
                self.expect(")")
                return CNode("sizeof", type_name, (), self.source(start))
            operand = self.unary()
            return CNode("sizeof_expr", None, (operand,), self.source(start))
        if token.kind == "op" and token.text == "(" and self.is_type_start(1):
            self.take()
            type_name = self.type_name()
            self.expect(")")
            operand = self.unary()
            return CNode("cast", type_name, (operand,), self.source(start))
        return self.postfix()

    def is_type_start(self, offset: int) -> bool:
        token = self.peek(offset)
        if token.kind != "ident":
            return False
        if token.text in TYPE_WORDS or token.text in ("struct", "union", "enum"):
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
            raise CParseError("expected a type name", self.peek().position)
        return " ".join(words)

    def postfix(self) -> CNode:
        start = self.peek().position
        node = self.primary()
        while True:
            if self.at("->") or self.at("."):
                operator = self.take().text
                member = self.take()
                if member.kind != "ident":
                    raise CParseError("expected a member name", member.position)
                if node.kind == "ident" and node.value == "REC" and operator == "->":
                    node = CNode("field", member.text, (), self.source(start))
                else:
                    raise CParseError(
                        f"member access {operator}{member.text} of {node.text!r}", member.position
                    )
            elif self.at("["):
                self.take()
                index = self.assignment()
                self.expect("]")
                node = CNode("index", None, (node, index), self.source(start))
            elif self.at("("):
                if node.kind != "ident":
                    raise CParseError(f"call of {node.text!r}", self.peek().position)
                self.take()
                args: list[CNode] = []
                if not self.at(")"):
                    args.append(self.argument())
                    while self.at(","):
                        self.take()
                        args.append(self.argument())
                self.expect(")")
                node = CNode("call", node.value, tuple(args), self.source(start))
            else:
                return node

    def argument(self) -> CNode:
        if self.at("{"):
            start = self.peek().position
            self.take()
            items: list[CNode] = []
            if not self.at("}"):
                items.append(self.argument())
                while self.at(","):
                    self.take()
                    if self.at("}"):
                        break
                    items.append(self.argument())
            self.expect("}")
            return CNode("braces", None, tuple(items), self.source(start))
        return self.assignment()

    def primary(self) -> CNode:
        token = self.take()
        if token.kind == "num":
            return CNode("num", token.value, (), token.text)
        if token.kind == "char":
            return CNode("num", (token.value, 10, "char"), (), token.text)
        if token.kind == "str":
            return CNode("str", token.value, (), token.text)
        if token.kind == "ident":
            return CNode("ident", token.text, (), token.text)
        if token.kind == "op" and token.text == "(":
            if self.at("{"):
                depth = 0
                while True:
                    inner = self.take()
                    if inner.kind == "end":
                        raise CParseError("unterminated statement expression", token.position)
                    if inner.kind == "op" and inner.text in ("(", "{"):
                        depth += 1
                    elif inner.kind == "op" and inner.text in (")", "}"):
                        depth -= 1
                        if depth < 0:
                            break
                return CNode("stmt", None, (), self.source(token.position))
            node = self.assignment()
            while self.at(","):
                self.take()
                node = self.assignment()
            self.expect(")")
            return node
        raise CParseError(f"unexpected {token.text or 'end of text'!r}", token.position)
