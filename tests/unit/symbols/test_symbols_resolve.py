"""resolve_specs: event names unique."""

from __future__ import annotations

from probescope.language.arch import X86_64
from probescope.language.model import ProbeSpec
from probescope.symbols.resolve import resolve_specs
from unit.symbols import symbol_programs as programs


def test_colliding_derived_names_are_numbered_past_the_names_taken() -> None:
    demo = programs.demo()
    probes = resolve_specs(
        [f"p:ps_add_1 {demo}:ps_measure", f"{demo}:ps_add", f"{demo}:ps_add", f"{demo}:ps_add"],
        arch=X86_64,
    )
    names = [p.spec.event_name for p in probes if isinstance(p.spec, ProbeSpec)]
    assert names == ["ps_add_1", "ps_add", "ps_add_2", "ps_add_3"]
