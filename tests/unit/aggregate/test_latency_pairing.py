"""Latency pairing by stack pointer, on hand-made event sequences."""

from __future__ import annotations

from probescope.aggregate.keys import KeyPlan
from probescope.aggregate.latency import ABANDONED, OPEN, UNMATCHED, LatencyAggregator
from probescope.events import EventBatch
from probescope.language.model import ProbeKind
from unit.aggregate.events_helper import event, event_type

F = event_type("f", ("__ps_sp",))
F_RET = event_type("f__return", ("__ps_sp",), ProbeKind.URETPROBE)
G = event_type("g", ("__ps_sp",))
G_RET = event_type("g__return", ("__ps_sp",), ProbeKind.URETPROBE)
RETURNS = {"f__return": "f", "g__return": "g"}


def run(events: list[tuple[object, int, int]], plan: tuple[str, ...] = ()) -> object:
    aggregator = LatencyAggregator("@latency_ns", KeyPlan(plan), RETURNS, unit="ns")
    batch = [event(kind, sp, ts=ts) for kind, sp, ts in events]  # type: ignore[arg-type]
    aggregator.add_batch(EventBatch(batch))
    return aggregator.snapshot(final=True)


def durations(result: object) -> dict[tuple[object, ...], tuple[int, int]]:
    return {
        key: (value.count, value.total_ns)
        for key, value in result.first.items()  # type: ignore[attr-defined]
    }


def test_recursion_pairs_each_call_with_its_own_return() -> None:
    result = run(
        [
            (F, 1000, 0),
            (F, 960, 10),
            (F, 920, 20),
            (F_RET, 928, 25),
            (F_RET, 968, 40),
            (F_RET, 1008, 100),
        ],
        ("probe",),
    )
    assert durations(result) == {("f",): (3, 5 + 30 + 100)}
    assert result.counters == {}  # type: ignore[attr-defined]


def test_longjmp_over_calls_drops_them() -> None:
    result = run([(F, 1000, 0), (G, 900, 5), (G, 800, 6), (F_RET, 1008, 50)])
    assert durations(result) == {(): (1, 50)}
    assert result.counters == {ABANDONED: 2}  # type: ignore[attr-defined]


def test_a_call_at_the_same_place_ends_an_abandoned_one() -> None:
    result = run([(F, 1000, 0), (G, 960, 1), (F, 1000, 10), (F_RET, 1008, 15)])
    assert durations(result) == {(): (1, 5)}
    assert result.counters == {ABANDONED: 2}  # type: ignore[attr-defined]


def test_tail_call_keeps_both_calls() -> None:
    result = run([(F, 1000, 0), (G, 1000, 3), (G_RET, 1008, 10), (F_RET, 1008, 10)], ("probe",))
    assert durations(result) == {("f",): (1, 10), ("g",): (1, 7)}


def test_returns_without_entries_and_calls_still_open() -> None:
    result = run([(F_RET, 1008, 5), (G, 500, 6)])
    assert durations(result) == {}
    assert result.counters == {UNMATCHED: 1, OPEN: 1}  # type: ignore[attr-defined]


def test_threads_are_paired_apart() -> None:
    aggregator = LatencyAggregator("@l", KeyPlan(("tid",)), RETURNS, unit="ns")
    aggregator.add_batch(
        EventBatch(
            [
                event(F, 1000, ts=0, tid=1),
                event(F, 1000, ts=1, tid=2),
                event(F_RET, 1008, ts=5, tid=2),
                event(F_RET, 1008, ts=9, tid=1),
            ]
        )
    )
    assert durations(aggregator.snapshot()) == {(1,): (1, 9), (2,): (1, 4)}
