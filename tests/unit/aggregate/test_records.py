"""The in-place fast path gives exactly what the event path gives, on ring-buffer pages
captured from the live kernel (no kernel access)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.captured import FIXTURES, CapturedCase, load_case
from probescope.aggregate.aggregators import EventAggregator
from probescope.aggregate.keys import KeyPlan
from probescope.aggregate.records import RecordAggregator, fast_path_possible
from probescope.aggregate.values import LinearScale
from probescope.traceevent.merge import merge_cpu_batches

CASES = [FIXTURES / "kernel-6.18.44-fc-v657" / name for name in ("multi_cpu", "uprobe_types")]


def both(case: CapturedCase, fields: tuple[str, ...], of: str | None = None, **kw: object):
    decoder = case.decoder()
    formats = {f.id: f for f in decoder.formats}
    events = {i: (formats[i], t) for i, t in decoder.event_types.items()}
    plan = KeyPlan(fields)

    def task_of(tid: int) -> tuple[str, int]:
        return case.comms.get(tid, "<...>"), case.tgids.get(tid, tid)

    fast = RecordAggregator("@m", plan, case.layout, events, of=of, task_of=task_of, **kw)
    for cpu, data in case.raw.items():
        for sub_buffer in _split(case, data):
            fast.feed(sub_buffer, cpu)
    slow = EventAggregator("@m", plan, of=of, **kw)  # type: ignore[arg-type]
    for batch in merge_cpu_batches(case.batches(decoder).values()):
        slow.add_batch(batch)
    return fast.snapshot(), slow.snapshot(), [t for _, t in events.values()]


def _split(case: CapturedCase, data: bytes) -> list[bytes]:
    size = case.layout.size
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("path", CASES, ids=lambda p: Path(p).name)
def test_counts_agree(path: Path) -> None:
    case = load_case(path)
    for fields in [("probe",), ("probe", "pid", "comm"), ("tid", "cpu"), ()]:
        fast, slow, types = both(case, fields)
        assert fast_path_possible(KeyPlan(fields), types, None)
        assert fast.first.counts() == slow.first.counts(), fields
        assert sum(fast.first.counts().values()) > 0


def test_counts_by_argument_and_histograms_agree() -> None:
    case = load_case(CASES[0])
    fast, slow, _ = both(case, ("worker",))
    assert fast.first.counts() == slow.first.counts()
    assert len(fast.first.counts()) == 2
    fast, slow, _ = both(case, ("worker",), of="iteration")
    assert fast.first.values == slow.first.values
    fast, slow, _ = both(case, (), of="iteration", scale=LinearScale(0, 100, 10))
    assert fast.first.values == slow.first.values


def test_uniform_runs_and_record_walks_both_serve() -> None:
    """multi_cpu's sub-buffers are runs of one record size (counted in C), uprobe_types mixes
    entry and return records (walked record by record)."""
    for name, uniform in (("multi_cpu", True), ("uprobe_types", False)):
        case = load_case(FIXTURES / "kernel-6.18.44-fc-v657" / name)
        decoder = case.decoder()
        formats = {f.id: f for f in decoder.formats}
        events = {i: (formats[i], t) for i, t in decoder.event_types.items()}
        aggregator = RecordAggregator("@m", KeyPlan(("probe",)), case.layout, events)
        for cpu, data in case.raw.items():
            for sub_buffer in _split(case, data):
                aggregator.feed(sub_buffer, cpu)
        assert (aggregator.uniform_runs > 0, aggregator.walked > 0) == (uniform, not uniform)


def test_strings_and_stacks_take_the_event_path() -> None:
    case = load_case(FIXTURES / "kernel-6.18.44-fc-v657" / "strings")
    decoder = case.decoder()
    types = list(decoder.event_types.values())
    string_args = [
        name
        for t in types
        for name, arg_type in zip(t.arg_names, t.arg_types, strict=True)
        if arg_type.is_string
    ]
    assert string_args
    assert not fast_path_possible(KeyPlan((string_args[0],)), types, None)
    assert not fast_path_possible(KeyPlan(("ustack",)), types, None)
