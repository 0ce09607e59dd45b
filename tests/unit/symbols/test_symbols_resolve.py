"""resolve_specs: every spec parsed before anything is located, problems collected with carets
under the user's text, friendly arguments lowered where the probe sits, event names unique."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import X86_64
from probescope.language.model import ProbeSpec
from probescope.symbols.resolve import resolve_specs
from unit.symbols import symbol_programs as programs


def caret_under(error: SpecError) -> str:
    assert error.column is not None
    return error.spec[error.column :]


def test_a_type_error_points_at_the_users_type() -> None:
    with pytest.raises(SpecError, match="unknown type 'u65'") as info:
        resolve_specs(["c:malloc size=arg1:u65"], arch=X86_64)
    assert not isinstance(info.value, SpecErrors)
    assert caret_under(info.value) == "u65"
    assert info.value.spec == "c:malloc size=arg1:u65"


def test_an_argument_error_is_reported_even_when_the_binary_does_not_exist() -> None:
    with pytest.raises(SpecErrors) as info:
        resolve_specs(["nosuchlib:malloc size=(arg1"], arch=X86_64)
    syntax, missing = info.value.errors
    assert "invalid fetch argument '(arg1'" in syntax.message
    assert caret_under(syntax) == "(arg1"
    assert "nosuchlib" in missing.message
    assert caret_under(missing).startswith("nosuchlib:malloc")


def test_every_spec_is_parsed_before_any_is_located() -> None:
    specs = ["nosuchlib:f", "c:malloc x=arg1:u65", "t:sched"]
    with pytest.raises(SpecErrors) as info:
        resolve_specs(specs, arch=X86_64)
    assert [e.spec for e in info.value.errors] == specs  # in the order given
    assert caret_under(info.value.errors[1]) == "u65"


def test_a_stack_argument_inside_a_function_points_at_the_users_argn() -> None:
    demo = programs.demo()
    first, second = programs.objdump_instructions(demo, "ps_add")[:2]
    text = f"{demo}:ps_add+{second - first} a=arg1 x=+8(arg9):u32"
    with pytest.raises(SpecError, match="arg9 is passed on the stack") as info:
        resolve_specs([text], arch=X86_64)
    assert caret_under(info.value) == "arg9):u32"
    (probe,) = resolve_specs([f"{demo}:ps_add a=arg1 x=+8(arg9):u32"], arch=X86_64)
    assert isinstance(probe.spec, ProbeSpec)
    assert [str(a) for a in probe.spec.args] == ["a=%di", "x=+8($stack3):u32"]


def test_retval_in_an_entry_probe_points_at_it() -> None:
    demo = programs.demo()
    text = f"{demo}:ps_add n=+0(retval):u32"
    with pytest.raises(SpecError, match="retval is only available in a return probe") as info:
        resolve_specs([text], arch=X86_64)
    assert caret_under(info.value) == "retval):u32"


def test_colliding_derived_names_are_numbered_past_the_names_taken() -> None:
    demo = programs.demo()
    probes = resolve_specs(
        [f"p:ps_add_1 {demo}:ps_measure", f"{demo}:ps_add", f"{demo}:ps_add", f"{demo}:ps_add"],
        arch=X86_64,
    )
    names = [p.spec.event_name for p in probes if isinstance(p.spec, ProbeSpec)]
    assert names == ["ps_add_1", "ps_add", "ps_add_2", "ps_add_3"]
