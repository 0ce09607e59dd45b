"""The committed capture (tests/fixtures/print_fmt/<release>/): every record of every event
whose print fmt compiles prints byte for byte as the kernel's `trace` printed it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.print_fmt.replay import compare, load_capture

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "print_fmt"
CAPTURES = sorted(p.parent for p in FIXTURES.glob("*/meta.json"))


def test_a_capture_is_committed() -> None:
    assert CAPTURES, f"no capture under {FIXTURES}"


@pytest.mark.parametrize("path", CAPTURES, ids=[p.name for p in CAPTURES])
def test_every_compiled_event_matches_the_kernel_text(path: Path) -> None:
    result = compare(load_capture(path))
    assert result.mismatched == {}, result.summary()
    assert result.context_only == {}
    matched = result.events_matched
    assert len(matched) >= 40, result.summary()
    assert len({name.split("/")[0] for name in matched}) >= 10
    assert sum(result.matched.values()) >= 1000
    for name, error in result.refused.items():
        assert all("jiffies" in problem for problem in error.problems), (name, error.problems)


@pytest.mark.parametrize("path", CAPTURES, ids=[p.name for p in CAPTURES])
def test_hashed_pointers_refuse_exactly_the_events_that_print_p(path: Path) -> None:
    plain = compare(load_capture(path))
    hashed = compare(load_capture(path, hash_pointers=True))
    newly_refused = set(hashed.refused) - set(plain.refused)
    assert newly_refused
    for name in newly_refused:
        assert all("hash-ptr" in problem for problem in hashed.refused[name].problems)
    assert hashed.mismatched == {}
    assert set(hashed.events_matched) == set(plain.events_matched) - newly_refused
