"""Hidden fetch arguments that copy stacks, and reading the copy back from events."""

from __future__ import annotations

import pytest

from probescope.aggregate.stack_capture import (
    MAX_PROBE_FIELDS,
    MAX_SNAPSHOT,
    REGISTERS,
    StackCapture,
    sample_reader,
    with_stack_capture,
)
from probescope.errors import ProbescopeError
from probescope.events import EventType
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from unit.aggregate.events_helper import event


def test_copy_fits_the_kernels_limit() -> None:
    texts = StackCapture().fetchargs()
    assert texts[0] == "__ps_ip=%ip:x64"
    assert texts[len(REGISTERS)] == "__ps_stack0=+0($stack):x64[64]"
    assert texts[-1] == "__ps_stack5=+2560($stack):x64[56]"
    assert 8 * len(REGISTERS) + MAX_SNAPSHOT == MAX_PROBE_FIELDS


def test_kernel_walk_copies_only_the_return_address() -> None:
    assert StackCapture("fp", kernel_walk=True).fetchargs() == ["__ps_ret=$stack0:x64"]


def test_bad_captures() -> None:
    with pytest.raises(ProbescopeError):
        StackCapture("lbr")
    with pytest.raises(ProbescopeError):
        StackCapture(size=12)
    with pytest.raises(ProbescopeError):
        StackCapture().fetchargs(room=32)


def test_probe_gets_the_arguments_and_events_give_the_sample_back() -> None:
    spec = parse_kernel_probe("p:g/e /bin/true:0x10 x=%di:u32 s=+0(%si):string")
    assert isinstance(spec, ProbeSpec)
    probe = with_stack_capture(ResolvedProbe(spec=spec, kind=ProbeKind.UPROBE), StackCapture())
    assert isinstance(probe.spec, ProbeSpec)
    args = probe.spec.args
    assert [a.name for a in args[:2]] == ["x", "s"]
    copied = sum(a.type.size * (a.type.count or 1) for a in args if a.name.startswith("__ps_stack"))
    assert copied == MAX_SNAPSHOT - 8  # the user's own 8 bytes of fields come off the copy
    kind = EventType(
        "g", "e", ProbeKind.UPROBE, tuple(a.name for a in args), tuple(a.type for a in args)
    )
    read = sample_reader(kind, at_function_entry=True)
    assert read is not None
    values: list[object] = [5, "s"]
    for arg in args[2:]:
        values.append(tuple(range(arg.type.count)) if arg.type.count else 0x1234)
    sample = read(event(kind, *values))
    assert sample.registers[16] == 0x1234 and sample.at_function_entry
    assert len(sample.stack) == copied and sample.read_word(sample.sp + 8) == 1
