"""Merging per-CPU batch streams into `trace` order with bounded memory."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeKind
from probescope.traceevent.merge import LiveMerge, merge_cpu_batches

TYPE = EventType("g", "e", ProbeKind.UPROBE)


def batch(cpu: int, *stamps: int, lost: int = 0) -> EventBatch:
    return EventBatch([Event(ts, cpu, 1, 1, "c", TYPE) for ts in stamps], lost, cpu)


def order(batches: Iterator[EventBatch]) -> list[tuple[int, int]]:
    return [(e.timestamp_ns, e.cpu) for b in batches for e in b.events]


def test_events_come_out_in_time_order_ties_to_the_lower_cpu() -> None:
    cpu0 = [batch(0, 1, 4, 6), batch(0, 9, 12)]
    cpu1 = [batch(1, 2, 4, 5), batch(1, 6, 20)]
    cpu2 = [batch(2, 3, 4)]
    assert order(merge_cpu_batches([cpu1, cpu2, cpu0])) == [
        (1, 0), (2, 1), (3, 2), (4, 0), (4, 1), (4, 2), (5, 1), (6, 0), (6, 1), (9, 0), (12, 0),
        (20, 1),
    ]  # fmt: skip


def test_runs_of_one_cpu_stay_together() -> None:
    cpu0 = [batch(0, 1, 2, 3, 4)]
    cpu1 = [batch(1, 10, 11)]
    runs = [(b.cpu, len(b)) for b in merge_cpu_batches([cpu0, cpu1])]
    assert runs == [(0, 4), (1, 2)]


def test_lost_counts_ride_on_the_first_run_of_their_batch() -> None:
    cpu0 = [batch(0, 1, 5, lost=3)]
    cpu1 = [batch(1, 2), batch(1, lost=7), batch(1, 6, lost=-1)]
    merged = [
        (b.cpu, [e.timestamp_ns for e in b.events], b.lost) for b in merge_cpu_batches([cpu0, cpu1])
    ]
    assert merged == [(0, [1], 3), (1, [2], 0), (0, [5], 0), (1, [6], -1)]


def test_loss_at_the_end_of_a_stream_is_an_empty_batch() -> None:
    merged = list(merge_cpu_batches([[batch(0, 1), batch(0, lost=2)], [batch(1, lost=5)]]))
    assert [(b.cpu, len(b), b.lost) for b in merged] == [(1, 0, 5), (0, 1, 0), (0, 0, 2)]


def test_streams_are_read_lazily() -> None:
    pulled: list[int] = []

    def stream(cpu: int, count: int) -> Iterator[EventBatch]:
        for n in range(count):
            pulled.append(cpu)
            yield batch(cpu, 10 * n + cpu, 10 * n + cpu + 1)

    merged = merge_cpu_batches([stream(0, 1000), stream(1, 1000)])
    first = [next(merged) for _ in range(4)]
    assert order(iter(first)) == [
        (0, 0), (1, 0), (1, 1), (2, 1), (10, 0), (11, 0), (11, 1), (12, 1),
    ]  # fmt: skip
    assert len(pulled) <= 5  # two batches to start, then one more per batch used up


def test_empty_input() -> None:
    assert list(merge_cpu_batches([])) == []
    assert list(merge_cpu_batches([[], [batch(1)]])) == []


def simulate_reader(seed: int, cpus: int = 3, passes: int = 40, limit: int = 2) -> list[object]:
    """What a live reader sees: CPUs write events as time goes on (time also passes while the
    reader reads), the reader visits the CPUs in turn, takes at most `limit` sub-buffers of
    up to 3 events from each and says when it found a CPU's buffer empty."""
    rng = random.Random(seed)
    now = 0
    buffers: list[list[int]] = [[] for _ in range(cpus)]

    def tick() -> None:
        nonlocal now
        for _ in range(rng.randrange(4)):
            now += rng.randrange(1, 5)
            buffers[rng.randrange(cpus)].append(now)

    seen: list[object] = []
    for _ in range(passes):
        for cpu in range(cpus):
            tick()
            for _ in range(limit):
                if not buffers[cpu]:
                    break
                taken, buffers[cpu][:3] = buffers[cpu][:3], []
                seen.append(batch(cpu, *taken))
                tick()
            if not buffers[cpu]:
                seen.append(cpu)
        seen.append(None)  # end of a pass: the engine asks for what is ready
    for cpu in range(cpus):
        if buffers[cpu]:
            seen.append(batch(cpu, *buffers[cpu]))
    return seen


@pytest.mark.parametrize("seed", range(30))
def test_live_merge_releases_events_in_trace_order(seed: int) -> None:
    merge = LiveMerge(range(3))
    released: list[tuple[int, int]] = []
    written: list[tuple[int, int]] = []
    for item in simulate_reader(seed):
        if isinstance(item, EventBatch):
            merge.add(item)
            written += [(e.timestamp_ns, e.cpu) for e in item.events]
        elif item is None:
            released += order(iter([merge.ready()]))
        else:
            assert isinstance(item, int)
            merge.caught_up(item)
    before_flush = len(released)
    released += order(iter([merge.flush()]))
    assert released == sorted(written)
    assert before_flush > len(written) // 2, "events come out while the stream runs"


def test_live_merge_holds_back_what_a_cpu_behind_could_still_precede() -> None:
    merge = LiveMerge([0, 1])
    merge.add(batch(0, 10, 20, 30))
    merge.caught_up(0)
    merge.add(batch(1, 5, 15))  # cpu 1 not caught up: its next event may be before 20
    assert order(iter([merge.ready()])) == [(5, 1), (10, 0)]
    assert merge.held == 3
    merge.caught_up(1)  # now everything cpu 1 writes comes after 30
    assert order(iter([merge.ready()])) == [(15, 1), (20, 0)]
    assert order(iter([merge.flush()])) == [(30, 0)]
