"""The kernel's trace-event filter language (Documentation/trace/events.rst, "Event filtering";
kernel/trace/trace_events_filter.c), parsed into a small tree: the bpf engine compiles it, the
ptrace engine evaluates it in Python, the tracefs engine hands the text to the kernel.

    expression := or
    or         := and ('||' and)*
    and        := unary ('&&' unary)*
    unary      := '!' unary | '(' or ')' | predicate
    predicate  := FIELD OP VALUE        OP: == != < <= > >= & ~

Numbers are C integers (decimal, 0x hex, 0 octal, a leading minus); strings are quoted with
" or ', or a bare word. `~` matches a string against a glob: `abc*` (front), `*abc` (end),
`*abc*` (middle), or a full glob. Errors carry the column of the offending token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from probescope.errors import SpecError

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|&&|\|\||[<>&~!()])
      | (?P<word>[^\s()&|!<>=~"']+)
    )""",
    re.VERBOSE,
)
NUMBER_OPERATORS = frozenset({"==", "!=", "<", "<=", ">", ">=", "&"})
STRING_OPERATORS = frozenset({"==", "!=", "~"})


@dataclass(frozen=True)
class Predicate:
    field: str
    op: str
    value: str  # the value's text, quotes removed
    quoted: bool
    column: int  # of the field name
    value_column: int


@dataclass(frozen=True)
class Not:
    operand: Expression


@dataclass(frozen=True)
class And:
    left: Expression
    right: Expression


@dataclass(frozen=True)
class Or:
    left: Expression
    right: Expression


Expression = Predicate | Not | And | Or


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    column: int


def parse_filter(text: str, *, spec: str | None = None, column: int = 0) -> Expression:
    """Parse a filter expression; SpecError columns point into `spec` (the whole probe spec,
    where the expression starts at `column`) or into the expression itself."""
    where = spec if spec is not None else text
    tokens = _tokenize(text, where, column)
    parser = _Parser(tokens, where, column, len(text))
    tree = parser.expression()
    if parser.position < len(tokens):
        token = tokens[parser.position]
        raise SpecError(
            f"unexpected {token.text!r} in filter", spec=where, column=column + token.column
        )
    return tree


def fields_of(tree: Expression) -> list[Predicate]:
    if isinstance(tree, Predicate):
        return [tree]
    if isinstance(tree, Not):
        return fields_of(tree.operand)
    return fields_of(tree.left) + fields_of(tree.right)


def parse_number(text: str) -> int | None:
    """A C integer as kstrtoll/kstrtoull read it (base 0), or None."""
    sign = 1
    body = text
    if body.startswith("-"):
        sign, body = -1, body[1:]
    elif body.startswith("+"):
        body = body[1:]
    if not body:
        return None
    try:
        if body[:2] in ("0x", "0X"):
            return sign * int(body[2:], 16)
        if body.startswith("0") and len(body) > 1:
            return sign * int(body[1:], 8)
        if body.isdigit():
            return sign * int(body, 10)
    except ValueError:
        return None
    return None


class OperandError(Protocol):
    def __call__(self, message: str, at: int, hint: str | None = None) -> SpecError: ...


def number_operand(predicate: Predicate, size: int, signed: bool, error: OperandError) -> int:
    """The value a number field of `size` bytes is compared with, cast to the field's type as
    the kernel casts it; `error(message, column)` for what the kernel would refuse."""
    if predicate.op == "~":
        raise error(
            f"'~' (glob match) is for strings; {predicate.field!r} is a number", predicate.column
        )
    value = parse_number(predicate.value)
    if value is None or predicate.quoted:
        raise error(
            f"{predicate.field!r} is a number; {predicate.value!r} is not an integer",
            predicate.value_column,
        )
    if value < 0 and not signed:
        raise error(
            f"{predicate.field!r} is unsigned; {predicate.value!r} is negative",
            predicate.value_column,
        )
    bits = 8 * size
    value &= (1 << bits) - 1
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def check_string_operator(predicate: Predicate, error: OperandError) -> None:
    """A string field compares with ==, != or ~ only."""
    if predicate.op not in ("==", "!=", "~"):
        raise error(
            f"string field {predicate.field!r} compares with ==, != or ~, not {predicate.op!r}",
            predicate.column,
        )


def _tokenize(text: str, where: str, column: int) -> list[_Token]:
    tokens = []
    position = 0
    while position < len(text):
        if not text[position:].strip():
            break
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            bad = position + len(text[position:]) - len(text[position:].lstrip())
            raise SpecError(
                f"unexpected character {text[bad]!r} in filter", spec=where, column=column + bad
            )
        kind = match.lastgroup or ""
        tokens.append(_Token(kind, match.group(kind), match.start(kind)))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[_Token], where: str, column: int, end: int) -> None:
        self.tokens = tokens
        self.position = 0
        self.where = where
        self.column = column
        self.end = end

    def _peek(self) -> _Token | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _error(self, message: str, at: int | None, hint: str | None = None) -> SpecError:
        return SpecError(
            message,
            spec=self.where,
            column=self.column + (self.end if at is None else at),
            hint=hint,
        )

    def expression(self) -> Expression:
        left = self._and()
        while (token := self._peek()) is not None and token.text == "||":
            self.position += 1
            left = Or(left, self._and())
        return left

    def _and(self) -> Expression:
        left = self._unary()
        while (token := self._peek()) is not None and token.text == "&&":
            self.position += 1
            left = And(left, self._unary())
        return left

    def _unary(self) -> Expression:
        token = self._peek()
        if token is None:
            raise self._error("the filter ends where a predicate should follow", None)
        if token.text == "!":
            self.position += 1
            return Not(self._unary())
        if token.text == "(":
            self.position += 1
            inner = self.expression()
            closing = self._peek()
            if closing is None or closing.text != ")":
                raise self._error(
                    "unbalanced parenthesis in filter", token.column, hint="close it with ')'"
                )
            self.position += 1
            return inner
        return self._predicate()

    def _predicate(self) -> Predicate:
        field = self._peek()
        assert field is not None
        if field.kind != "word":
            raise self._error(
                f"expected a field name, found {field.text!r}",
                field.column,
                hint='e.g. size > 4096 && name ~ "lib*"',
            )
        self.position += 1
        op = self._peek()
        if op is None or op.text not in NUMBER_OPERATORS | STRING_OPERATORS:
            raise self._error(
                f"expected a comparison after {field.text!r}",
                None if op is None else op.column,
                hint="==, !=, <, <=, >, >=, & (bits set) or ~ (glob match)",
            )
        self.position += 1
        value = self._peek()
        if value is None or value.kind not in ("word", "string"):
            raise self._error(
                f"missing value after {op.text!r}", None if value is None else value.column
            )
        self.position += 1
        quoted = value.kind == "string"
        text = _unquote(value.text) if quoted else value.text
        return Predicate(field.text, op.text, text, quoted, field.column, value.column)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


def glob_kind(text: str) -> tuple[str, str]:
    """The kernel's `filter_parse_regex`: which match a `~` pattern asks for (`full`, `front`
    for abc*, `end` for *abc, `middle` for *abc*, or `glob`), and the text to match."""
    kind = "full"
    for index, char in enumerate(text):
        if char == "*":
            if index == 0:
                kind = "end"
            elif index == len(text) - 1:
                kind = "middle" if kind == "end" else "front"
                break
            else:
                return "glob", text
        elif char in "[?\\":
            return "glob", text
    if kind == "end":
        return kind, text[1:]
    if kind == "middle":
        return kind, text[1:-1]
    if kind == "front":
        return kind, text[:-1]
    return kind, text
