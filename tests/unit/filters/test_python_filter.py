"""The kernel's event filter evaluated in Python (the ptrace engine's filters, and the checks
every engine makes first), and `... if EXPR` split off a probe spec."""

from __future__ import annotations

import pytest

from probescope.engines.python_filter import compile_filter, uprobe_fields
from probescope.errors import SpecError, SpecErrors
from probescope.events import Event, EventType
from probescope.language.friendly import FriendlyProbe
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.parse import parse_probe
from probescope.language.static_events import TracepointSpec

SPEC = "./prog:f n=arg1:s32 b=+0(arg2):u8 name=+0(arg3):string arr=+0(arg4):u8[4]"


def fields():
    spec = parse_probe(SPEC)
    assert isinstance(spec, FriendlyProbe)
    return uprobe_fields(spec.args, is_return=False)


def event(n: int = 0, b: int = 0, name: str | None = "", comm: str = "prog", cpu: int = 1):
    kind = EventType("uprobes", "f", ProbeKind.UPROBE, ("n", "b", "name", "arr"))
    return Event(1, cpu, 42, 43, comm, kind, 0x1234, None, (n, b, name, (1, 2, 3, 4)))


def keeps(expression: str, **values: object) -> bool:
    return compile_filter(expression, fields())(event(**values))  # type: ignore[arg-type]


def test_numbers_in_the_fields_own_type() -> None:
    assert keeps("n > 2", n=3) and not keeps("n > 2", n=2)
    assert keeps("n < -1", n=-5)
    assert keeps("b == 300", b=44)  # the kernel casts 300 to u8
    assert keeps("n == 0xffffffff", n=-1)  # and 0xffffffff to s32
    assert keeps("b & 6", b=2) and not keeps("b & 6", b=9)
    assert keeps("n == 010", n=8)  # C octal, as kstrtoll reads it


def test_strings_and_globs() -> None:
    assert keeps('name == "abc"', name="abc") and not keeps("name == abc", name="abcd")
    assert keeps("name != abc", name="abd")
    assert keeps('name ~ "ab*"', name="abc") and not keeps('name ~ "ab*"', name="cab")
    assert keeps('name ~ "*bc"', name="abc") and keeps('name ~ "*b*"', name="abc")
    assert keeps('name ~ "a?c"', name="abc") and keeps('name ~ "[ab]bc"', name="bbc")
    assert keeps('name ~ "!ab*"', name="xyz") and not keeps('name ~ "!ab*"', name="abc")
    assert keeps('name == ""', name=None)  # a faulted read is an empty string


def test_pseudo_fields_and_logic() -> None:
    assert keeps("comm == prog && cpu == 1")
    assert not keeps("comm ~ bash* || CPU != 1")
    assert keeps("!(n > 2) && common_pid == 43", n=1)
    assert keeps("__probe_ip == 0x1234")


@pytest.mark.parametrize(
    ("expression", "message", "at"),
    [
        ("nope == 1", "no field 'nope' to filter on", "nope"),
        ("arr == 1", "no field 'arr' to filter on", "arr"),
        ("n ~ 3", "'~' (glob match) is for strings", "n"),
        ('n == "3"', "'n' is a number; '3' is not an integer", '"3"'),
        ("b > -1", "'b' is unsigned; '-1' is negative", "-1"),
        ("name > abc", "string field 'name' compares with ==, != or ~", "name"),
        ("n >", "missing value after '>'", None),
        ("(n > 1", "unbalanced parenthesis", "("),
    ],
)
def test_errors_point_at_the_offending_token(expression: str, message: str, at: str | None) -> None:
    text = f"{SPEC} if {expression}"
    with pytest.raises(SpecError) as raised:
        compile_filter(expression, fields(), spec=text, column=text.rindex(expression))
    assert message in raised.value.message
    if at is not None:
        assert raised.value.column == text.rindex(expression) + expression.index(at)


def test_every_problem_is_reported() -> None:
    with pytest.raises(SpecErrors) as raised:
        compile_filter("nope == 1 && b > -1", fields())
    assert len(raised.value.errors) == 2


def test_return_probes_have_their_own_fields() -> None:
    returns = uprobe_fields((), is_return=True)
    assert "__probe_func" in returns and "__probe_ret_ip" in returns
    assert "__probe_ip" not in returns


@pytest.mark.parametrize(
    ("text", "kind", "head"),
    [
        ("./prog:f x=arg1:s32 if x > 2", FriendlyProbe, "./prog:f x=arg1:s32"),
        ("r:./prog:f if common_pid == 4", FriendlyProbe, "r:./prog:f"),
        ("p:g/e /bin/true:0x10 x=%di:s32 if x == 1", ProbeSpec, "p:g/e /bin/true:0x10"),
    ],
)
def test_if_is_split_off_uprobe_specs(text: str, kind: type, head: str) -> None:
    spec = parse_probe(text)
    assert isinstance(spec, kind)
    assert spec.filter == text.split(" if ", 1)[1]  # type: ignore[attr-defined]
    assert spec.source == text  # type: ignore[attr-defined]
    if isinstance(spec, ProbeSpec):
        assert " if " not in spec.definition(), "uprobe_events takes no filter"


def test_tracepoints_keep_their_own_if() -> None:
    spec = parse_probe("t:sched:sched_switch if prev_pid == 1")
    assert isinstance(spec, TracepointSpec) and spec.filter == "prev_pid == 1"


def test_if_without_an_expression() -> None:
    with pytest.raises(SpecError, match="no filter expression after 'if'") as raised:
        parse_probe("./prog:f x=arg1:s32 if")
    assert raised.value.column == len("./prog:f x=arg1:s32 ")
