"""Probes renamed into a session's group: one EventType per event, collisions numbered."""

from __future__ import annotations

from probescope.engines.tracefs.session_events import session_specs
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe


def probe(line: str) -> ResolvedProbe:
    spec = parse_kernel_probe(line, events_file="uprobe_events")
    assert isinstance(spec, ProbeSpec)
    return ResolvedProbe.from_uprobe_spec(spec)


def test_probes_are_renamed_into_the_group_and_collisions_numbered() -> None:
    long = "f" * 63
    probes = [
        probe("p:a/ev /bin/true:0x10 x=%di:u32"),
        probe("p:a/ev /bin/true:0x20 x=%di:u32"),  # another place of the same event
        probe("p:b/ev /bin/true:0x30"),  # same name, other group: numbered
        probe(f"p:a/{long} /bin/true:0x40"),
        probe(f"p:b/{long} /bin/true:0x50"),
    ]
    session = session_specs(probes, "session_group")
    assert [s.group for s in session.specs] == ["session_group"] * 5
    names = [s.event for s in session.specs]
    assert names == ["ev", "ev", "ev_1", long, long[:61] + "_1"]
    assert all(len(name) <= 63 for name in names)
    assert list(session.types) == ["ev", "ev_1", long, long[:61] + "_1"]
    first, second = session.types["ev"], session.types["ev_1"]
    assert (first.group, first.name, first.kind) == ("a", "ev", ProbeKind.UPROBE)
    assert first.arg_names == ("x",)
    assert (second.group, second.name, second.arg_names) == ("b", "ev_1", ())
