"""The filter language: parse trees, errors with their columns, the kernel's glob forms, and
the checks made against a probe's fields before anything is compiled."""

from __future__ import annotations

import pytest

from probescope.engines.bpf.filter_compile import (
    FixedString,
    LocatedString,
    NumberField,
    glob_kind,
    plan_filter,
)
from probescope.errors import SpecError, SpecErrors
from probescope.language.filter_grammar import (
    And,
    Not,
    Or,
    Predicate,
    parse_filter,
    parse_number,
)


def test_precedence_and_parentheses() -> None:
    tree = parse_filter("a == 1 || b == 2 && !(c < 3)")
    assert isinstance(tree, Or)
    assert isinstance(tree.left, Predicate) and tree.left.field == "a"
    assert isinstance(tree.right, And)
    assert isinstance(tree.right.right, Not)
    inner = tree.right.right.operand
    assert isinstance(inner, Predicate) and (inner.field, inner.op, inner.value) == ("c", "<", "3")


def test_values_quoted_and_bare() -> None:
    tree = parse_filter('name ~ "lib*" && comm == bash')
    assert isinstance(tree, And)
    assert isinstance(tree.left, Predicate) and tree.left.quoted and tree.left.value == "lib*"
    assert isinstance(tree.right, Predicate) and not tree.right.quoted
    assert tree.right.value == "bash"


@pytest.mark.parametrize(
    ("text", "column", "message"),
    [
        ("a ==", 4, "missing value"),
        ("a 1", 2, "expected a comparison"),
        ("(a == 1", 0, "unbalanced"),
        ("a == 1 b", 7, "unexpected"),
        ("== 1", 0, "expected a field name"),
        ("a == 1 &&", 9, "ends where a predicate"),
    ],
)
def test_errors_point_at_the_offending_token(text: str, column: int, message: str) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        parse_filter(text)
    assert caught.value.column == column


def test_error_columns_count_in_the_whole_spec() -> None:
    spec = "p:g/e /bin/true:0x10 x=%di if x =="
    with pytest.raises(SpecError) as caught:
        parse_filter("x ==", spec=spec, column=spec.index("x =="))
    assert caught.value.column == len(spec)


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", 42), ("0x2a", 42), ("052", 42), ("-5", -5), ("0", 0), ("x", None), ("0x", None)],
)
def test_numbers_as_kstrtoll_reads_them(text: str, value: int | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("pattern", "kind", "text"),
    [
        ("abc", "full", "abc"),
        ("abc*", "front", "abc"),
        ("*abc", "end", "abc"),
        ("*abc*", "middle", "abc"),
        ("*", "end", ""),
        ("**", "middle", ""),
        ("a*c", "glob", "a*c"),
        ("a?c", "glob", "a?c"),
        ("[ab]c", "glob", "[ab]c"),
    ],
)
def test_glob_forms_as_filter_parse_regex_sorts_them(pattern: str, kind: str, text: str) -> None:
    assert glob_kind(pattern) == (kind, text)


FIELDS = {
    "n": NumberField(56, 4, True),
    "u": NumberField(60, 1, False),
    "s": LocatedString(61, 0, 4096),
    "comm": FixedString(40, 16),
}


def plan(text: str) -> dict:  # type: ignore[type-arg]
    return plan_filter(
        parse_filter(text), FIELDS.get, spec=text, column=0, fields_hint="fields: n, u, s, comm"
    )


def test_values_are_cast_to_the_fields_type() -> None:
    (number,) = plan("u == 300").values()
    assert number.number == 300 & 0xFF
    (negative,) = plan("n == -1").values()
    assert negative.number == -1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("zz == 1", "no field 'zz'"),
        ("n ~ 1", "is a number"),
        ('n == "x"', "not an integer"),
        ("u == -1", "is unsigned"),
        ("s < 3", "compares with ==, != or ~"),
        ('s ~ "a*c"', "globs of the forms"),
    ],
)
def test_problems_are_found_before_compiling(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        plan(text)


def test_every_problem_is_collected() -> None:
    with pytest.raises(SpecErrors) as caught:
        plan("zz == 1 && n ~ 2")
    assert len(caught.value.errors) == 2


def test_string_matches_and_negation() -> None:
    plans = plan('s ~ "!*x*" || comm != "bash"')
    kinds = sorted((p.match, p.negate) for p in plans.values())
    assert kinds == [("full", True), ("middle", True)]
