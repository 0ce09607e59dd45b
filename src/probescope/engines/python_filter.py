"""The kernel's event filter (`language.event_filter`) evaluated in Python on Events, for an
engine with no filter in the kernel (ptrace), and the field checks every engine makes before
it touches anything: the same grammar, fields and errors as the tracefs engine's `filter` file.

A uprobe event's fields are its arguments (by name), `__probe_ip` (entries) or `__probe_func`
and `__probe_ret_ip` (returns), `common_pid` (the thread id), and the kernel's pseudo fields
`comm` and `cpu`. Comparisons follow kernel/trace/trace_events_filter.c: a number is cast to
the field's size and signedness before it is compared (`u8 x == 300` tests 44), `&` tests
that any of its bits is set, a negative number against an unsigned field is refused; strings
compare whole with `==`/`!=`, and `~` matches a glob (`abc*`, `*abc`, `*abc*` or a full glob;
a leading `!` negates). Arrays cannot be filtered on, as in the kernel.
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from probescope.errors import SpecError, SpecErrors
from probescope.events import Event
from probescope.language.event_filter import (
    And,
    Expression,
    Not,
    Or,
    Predicate,
    check_string_operator,
    fields_of,
    glob_kind,
    number_operand,
    parse_filter,
)
from probescope.language.model import ArgType, FetchArg, ProbeSpec
from probescope.language.resolved import ResolvedProbe

Test = Callable[[Event], bool]


@dataclass(frozen=True)
class _Field:
    """Where a field's value is in an Event, and how it compares."""

    get: Callable[[Event], Any]
    string: bool
    size: int = 8
    signed: bool = False


def uprobe_fields(args: Sequence[FetchArg], *, is_return: bool) -> dict[str, _Field]:
    """The fields of a uprobe event with these arguments, by the names a filter uses."""
    fields: dict[str, _Field] = {
        "common_pid": _Field(operator.attrgetter("tid"), False, 4, True),
        "common_flags": _Field(operator.attrgetter("flags"), False, 1, False),
        "common_preempt_count": _Field(operator.attrgetter("preempt_count"), False, 1, False),
        "comm": _Field(operator.attrgetter("comm"), True),
        "COMM": _Field(operator.attrgetter("comm"), True),
        "cpu": _Field(operator.attrgetter("cpu"), False, 4, False),
        "CPU": _Field(operator.attrgetter("cpu"), False, 4, False),
    }
    if is_return:
        fields["__probe_func"] = _Field(operator.attrgetter("ip"), False)
        fields["__probe_ret_ip"] = _Field(lambda e: e.ret_ip or 0, False)
    else:
        fields["__probe_ip"] = _Field(operator.attrgetter("ip"), False)
    for index, arg in enumerate(args):
        field = _arg_field(index, arg.type)
        if field is not None:
            fields[arg.name] = field
    return fields


def _arg_field(index: int, arg_type: ArgType) -> _Field | None:
    if arg_type.count:
        return None  # arrays cannot be filtered on (neither can the kernel)
    get = operator.itemgetter(index)

    def value(event: Event) -> Any:
        return get(event.args)

    if arg_type.is_string:
        return _Field(value, True)
    return _Field(value, False, arg_type.size, arg_type.signed)


def compile_filter(
    expression: str, fields: dict[str, _Field], *, spec: str | None = None, column: int = 0
) -> Test:
    """The filter as a test on Events; SpecError (every problem, with its caret in `spec`,
    where the expression starts at `column`) for an unknown field or a comparison the field's
    type does not take."""
    tree = parse_filter(expression, spec=spec, column=column)
    where = spec if spec is not None else expression
    tests: dict[Predicate, Test] = {}
    errors: list[SpecError] = []
    for predicate in fields_of(tree):
        try:
            tests[predicate] = _predicate(predicate, fields, where, column)
        except SpecError as error:
            errors.append(error)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return _combine(tree, tests)


def _combine(tree: Expression, tests: dict[Predicate, Test]) -> Test:
    if isinstance(tree, Predicate):
        return tests[tree]
    if isinstance(tree, Not):
        inner = _combine(tree.operand, tests)
        return lambda event: not inner(event)
    left, right = _combine(tree.left, tests), _combine(tree.right, tests)
    if isinstance(tree, And):
        return lambda event: left(event) and right(event)
    assert isinstance(tree, Or)
    return lambda event: left(event) or right(event)


_NUMBER_TESTS: dict[str, Callable[[int, int], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "&": lambda value, bits: bool(value & bits),
}


def _predicate(predicate: Predicate, fields: dict[str, _Field], spec: str, column: int) -> Test:
    def error(message: str, at: int, hint: str | None = None) -> SpecError:
        return SpecError(message, spec=spec, column=column + at, hint=hint)

    field = fields.get(predicate.field)
    if field is None:
        names = ", ".join(name for name in fields if name not in ("COMM", "CPU"))
        raise error(
            f"no field {predicate.field!r} to filter on",
            predicate.column,
            hint=f"fields: {names} (arrays cannot be filtered on)",
        )
    get = field.get
    if not field.string:
        value = number_operand(predicate, field.size, field.signed, error)
        compare = _NUMBER_TESTS[predicate.op]
        return lambda event: compare(get(event), value)
    check_string_operator(predicate, error)
    text = predicate.value
    if predicate.op != "~":
        equal = predicate.op == "=="
        return lambda event: ((get(event) or "") == text) is equal
    negate = text.startswith("!")
    if negate:
        text = text[1:]
    match = _string_match(text)
    return lambda event: match(get(event) or "") is not negate


def _string_match(pattern: str) -> Callable[[str], bool]:
    kind, text = glob_kind(pattern)
    if kind == "front":
        return lambda value: value.startswith(text)
    if kind == "end":
        return lambda value: value.endswith(text)
    if kind == "middle":
        return lambda value: text in value
    if kind == "glob":
        return lambda value: fnmatch.fnmatchcase(value, text)
    return lambda value: value == text


def probe_filters(
    probes: Sequence[ResolvedProbe], default_filter: str | None
) -> dict[ResolvedProbe, tuple[str, Test]]:
    """Each dynamic probe's filter — its own (`... if EXPR`) or the session's default — checked
    against its fields: (expression, test) by probe. Every problem of every probe is collected
    before SpecErrors is raised."""
    found: dict[ResolvedProbe, tuple[str, Test]] = {}
    errors: list[SpecError] = []
    for probe in probes:
        spec = probe.spec
        if not isinstance(spec, ProbeSpec):
            continue
        expression = spec.filter or default_filter
        if not expression:
            continue
        text = spec.source or spec.definition()
        column = text.rfind(expression) if spec.filter and expression in text else None
        fields = uprobe_fields(spec.args, is_return=probe.kind.is_return)
        try:
            test = compile_filter(
                expression,
                fields,
                spec=text if column is not None else None,
                column=column or 0,
            )
        except SpecErrors as many:
            errors += many.errors
            continue
        except SpecError as error:
            errors.append(error)
            continue
        found[probe] = (expression, test)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return found
