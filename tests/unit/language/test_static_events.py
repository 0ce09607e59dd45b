"""Parsing tracepoint and function-tracer specs."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError
from probescope.language.parse import parse_probe
from probescope.language.static_events import FunctionSpec, TracepointSpec


@pytest.mark.parametrize(
    ("text", "system", "event", "filter_text"),
    [
        ("tracepoint:sched:sched_switch", "sched", "sched_switch", None),
        ("t:sched:sched_switch", "sched", "sched_switch", None),
        ("t:sched:*", "sched", "*", None),
        ("t:sched:sched_switch if prev_pid == 42", "sched", "sched_switch", "prev_pid == 42"),
        (
            't:sched:sched_switch if prev_comm ~ "b*" && x',
            "sched",
            "sched_switch",
            'prev_comm ~ "b*" && x',
        ),
    ],
)
def test_tracepoints(text: str, system: str, event: str, filter_text: str | None) -> None:
    spec = parse_probe(text)
    assert isinstance(spec, TracepointSpec)
    assert (spec.system, spec.event, spec.filter) == (system, event, filter_text)


@pytest.mark.parametrize(
    ("text", "message", "at"),
    [
        ("t:sched", "is not SYSTEM:EVENT", "sched"),
        ("t:sched:sched switch", "a filter follows 'if'", "switch"),
        ("t:sched:x if", "no filter expression", "if"),
        ("t:sch$d:x", "invalid character", "$"),
    ],
)
def test_tracepoint_errors(text: str, message: str, at: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_probe(text)
    assert info.value.column is not None and text[info.value.column :].startswith(at)


def test_functions() -> None:
    spec = parse_probe("f:vfs_*")
    assert spec == FunctionSpec("vfs_*")
    assert not spec.traces_everything
    assert parse_probe("function:*").traces_everything  # type: ignore[union-attr]
    assert not parse_probe("f:*:mod:ext4").traces_everything  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="missing function pattern"):
        parse_probe("f:")
    with pytest.raises(SpecError, match="no arguments"):
        parse_probe("f:vfs_read x=1")


def test_usdt_specs() -> None:
    from probescope.language.usdt_spec import UsdtSpec

    spec = parse_probe("usdt:/usr/bin/python3.11:python:gc__start")
    assert isinstance(spec, UsdtSpec)
    assert (spec.target, spec.provider, spec.name, spec.args) == (
        "/usr/bin/python3.11",
        "python",
        "gc__start",
        (),
    )
    spec = parse_probe("usdt:/weird:dir/prog:prov:na* path=arg1:string arg3")
    assert isinstance(spec, UsdtSpec)
    assert (spec.target, spec.provider, spec.name) == ("/weird:dir/prog", "prov", "na*")
    assert [(a.name, a.index, a.type) for a in spec.args] == [
        ("path", 1, "string"),
        ("arg3", 3, None),
    ]
    for bad, message in [
        ("usdt:prog:name", "TARGET:PROVIDER:NAME"),
        ("usdt:prog:p:n %di", "does not name a probe argument"),
        ("usdt:prog:p:n arg0", "does not name a probe argument"),
        ("usdt:prog:p:n x=arg1 x=arg2", "repeated"),
    ]:
        with pytest.raises(SpecError, match=message):
            parse_probe(bad)
