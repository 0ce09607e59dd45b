"""Check a trace-event filter expression against the event's fields before the kernel sees it,
so a typo in a field name is reported with a caret instead of a bare EINVAL."""

from __future__ import annotations

import re
from dataclasses import dataclass

from probescope.errors import SpecError
from probescope.traceevent.format import EventFormat

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>-?(?:0[xX][0-9a-fA-F]+|\d+))
      | (?P<op>==|!=|<=|>=|&&|\|\||[<>&~!()])
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_]+)?)
    )""",
    re.VERBOSE,
)
_COMPARISONS = {"==", "!=", "<", "<=", ">", ">=", "&", "~"}
_STRING_OPERATORS = {"==", "!=", "~"}
_SPECIAL_FIELDS = {"CPU": False, "cpu": False, "COMM": True, "comm": True}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    column: int


def _tokens(expression: str) -> list[_Token]:
    tokens = []
    position = 0
    while position < len(expression):
        if expression[position:].strip() == "":
            break
        match = _TOKEN.match(expression, position)
        if match is None or match.end() == position:
            raise ValueError(
                position + len(expression[position:]) - len(expression[position:].lstrip())
            )
        kind = match.lastgroup or ""
        tokens.append(_Token(kind, match.group(kind), match.start(kind)))
        position = match.end()
    return tokens


def _is_string_field(event_format: EventFormat, name: str) -> bool:
    field = event_format.field(name)
    return field.element_type == "char" and (field.is_dynamic or field.is_array)


def check_filter(expression: str, event_format: EventFormat, *, spec: str, column: int) -> None:
    """Raise SpecError (caret at the offending token) for unknown fields, a missing value,
    or a string compared with a number; the kernel still has the last word."""

    def error(message: str, at: int, hint: str | None = None) -> SpecError:
        return SpecError(message, spec=spec, column=column + at, hint=hint)

    try:
        tokens = _tokens(expression)
    except ValueError as bad:
        at = int(str(bad.args[0]))
        raise error(f"unexpected character {expression[at]!r} in filter", at) from None
    fields = {f.name for f in event_format.all_fields}
    listing = ", ".join(sorted(f.name for f in event_format.fields))
    i = 0
    predicates = 0
    while i < len(tokens):
        token = tokens[i]
        if token.kind == "op" and token.text in ("(", ")", "&&", "||", "!"):
            i += 1
            continue
        if token.kind != "name":
            raise error(f"expected a field name, found {token.text!r}", token.column)
        name = token.text.split(".", 1)[0]
        if name not in fields and name not in _SPECIAL_FIELDS:
            raise error(
                f"{event_format.name} has no field {name!r}",
                token.column,
                hint=f"fields: {listing}",
            )
        if i + 1 >= len(tokens) or tokens[i + 1].text not in _COMPARISONS:
            raise error(
                f"expected a comparison after {name!r}",
                token.column + len(token.text),
                hint='e.g. prev_pid == 42, comm ~ "bash*"',
            )
        operator = tokens[i + 1]
        if i + 2 >= len(tokens) or tokens[i + 2].kind not in ("number", "string", "name"):
            raise error(
                f"missing value after {operator.text!r}", operator.column + len(operator.text)
            )
        value = tokens[i + 2]
        is_string = (
            _SPECIAL_FIELDS[name]
            if name in _SPECIAL_FIELDS
            else _is_string_field(event_format, name)
        )
        if is_string:
            if operator.text not in _STRING_OPERATORS:
                raise error(
                    f"string field {name!r} compares with ==, != or ~, not {operator.text!r}",
                    operator.column,
                )
        elif operator.text == "~":
            raise error(
                f"'~' (glob match) is for string fields; {name!r} is a number", operator.column
            )
        elif value.kind == "string":
            raise error(f"numeric field {name!r} compared with a string", value.column)
        predicates += 1
        i += 3
    if predicates == 0:
        raise error("empty filter", 0, hint="e.g. prev_pid == 42")
