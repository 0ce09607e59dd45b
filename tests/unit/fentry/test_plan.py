"""Where a function entry is patched, and the detour refusal rules (mechanisms.md §10)."""

from __future__ import annotations

import pytest

from probescope.engines.fentry.plan import SitePlan, plan_entry
from probescope.engines.fentry.relocate import CONDITIONAL, RIP_RELATIVE, Refused
from probescope.symbols.entry_sites import EntrySites

from .shapes import patchable_library, shapes_library


@pytest.fixture(scope="module")
def shapes() -> EntrySites:
    return EntrySites.for_path(shapes_library())


def plan(sites: EntrySites, name: str) -> SitePlan:
    return plan_entry(sites, sites.table.lookup(name))


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("loop_head", "jumps to +0x2, inside the 7 bytes a detour replaces (a loop head)"),
        ("jump_table", "indirect jump"),
        ("call_first", "a call"),
        ("tiny_adjacent", "not followed by alignment padding"),
        ("flags_in", "reads the incoming CF flags"),
        ("symbol_inside", "symbol inner_label starts at +0x2"),
        ("hot", "jumps to +0x2"),
    ],
)
def test_refused_with_the_reason(shapes: EntrySites, name: str, reason: str) -> None:
    with pytest.raises(Refused, match="^" + name) as refused:
        plan(shapes, name)
    assert reason in str(refused.value)


def test_a_short_function_in_padding_is_detoured(shapes: EntrySites) -> None:
    site = plan(shapes, "tiny_padded")
    assert site.length == 5
    assert [d.text for d in site.displaced] == ["xor eax, eax", "ret"]
    assert site.ends_in_stub


def test_flags_set_by_displaced_code_may_be_read_there(shapes: EntrySites) -> None:
    site = plan(shapes, "flags_own")
    assert CONDITIONAL in [d.kind for d in site.displaced]


def test_rip_relative_operands_are_displaced(shapes: EntrySites) -> None:
    site = plan(shapes, "riprel")
    assert site.displaced[0].kind == RIP_RELATIVE
    assert site.length == 6


def test_a_loop_back_to_the_entry_itself_is_fine(shapes: EntrySites) -> None:
    assert plan(shapes, "back_to_entry").length >= 5


def test_endbr64_stays_in_place(shapes: EntrySites) -> None:
    function = shapes.table.lookup("with_endbr")
    site = plan(shapes, "with_endbr")
    assert site.function_offset == function.offset
    assert site.patch_offset == function.offset + 4
    assert site.original == shapes.code(function.offset + 4, site.length)


def test_patchable_entries_are_nop_sites() -> None:
    sites = EntrySites.for_path(patchable_library())
    for name in ("patchable", "plain"):
        site = plan(sites, name)
        assert site.nop
        assert site.displaced == ()
        assert site.original == b"\x90" * 5
