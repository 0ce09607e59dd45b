"""Per-CPU event streams in the order the kernel's `trace` file prints them: by timestamp, ties
to the lower CPU — for a recording read to its end (`merge_cpu_batches`) and for a live stream
as soon as no earlier event can still come (`LiveMerge`)."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from operator import itemgetter

from probescope.events import Event, EventBatch

_TIMESTAMP = itemgetter(Event._fields.index("timestamp_ns"))


class LiveMerge:
    """Events of a live stream in the order `trace` prints them, across CPUs, as soon as no
    earlier event can still come.

    Fed in the order a reader read the ring buffer: `add` a CPU's decoded sub-buffer, and
    `caught_up` when the reader found that CPU's buffer empty. A CPU's future events are no
    earlier than its last one; after it was caught up, they are also later than everything
    the reader had read from any CPU by then (written before being read). The smallest of
    these bounds is the time up to which `ready()` can release events; `flush()` releases
    all at the end. What is held back is what one reader pass can skew between CPUs.
    """

    def __init__(self, cpus: Iterable[int]) -> None:
        self._pending: dict[int, list[Event]] = {cpu: [] for cpu in cpus}
        self._bound: dict[int, int] = dict.fromkeys(self._pending, -1)
        self._latest = -1

    def add(self, batch: EventBatch) -> None:
        events = batch.events
        if not events:
            return
        cpu = batch.cpu if batch.cpu is not None else -1
        pending = self._pending.get(cpu)
        if pending is None:
            pending = self._pending[cpu] = []
            self._bound[cpu] = -1
        pending += events
        last = events[-1].timestamp_ns
        if last > self._bound[cpu]:
            self._bound[cpu] = last
        if last > self._latest:
            self._latest = last

    def caught_up(self, cpu: int) -> None:
        if self._latest > self._bound.get(cpu, -1):
            self._bound[cpu] = self._latest

    def ready(self) -> EventBatch:
        """The held events older than every CPU's bound, merged."""
        limit = min(self._bound.values(), default=-1)
        runs = []
        for cpu, pending in self._pending.items():
            if not pending:
                continue
            if pending[-1].timestamp_ns < limit:
                runs.append(pending)
                self._pending[cpu] = []
                continue
            stop = bisect_left(pending, limit, key=_TIMESTAMP)
            if stop:
                runs.append(pending[:stop])
                del pending[:stop]
        return _merged(runs)

    def flush(self) -> EventBatch:
        runs = [pending for pending in self._pending.values() if pending]
        self._pending = {cpu: [] for cpu in self._pending}
        return _merged(runs)

    @property
    def held(self) -> int:
        return sum(map(len, self._pending.values()))


def _merged(runs: list[list[Event]]) -> EventBatch:
    if not runs:
        return EventBatch([])
    if len(runs) == 1:
        return EventBatch(runs[0])
    return EventBatch(list(heapq.merge(*runs, key=_TIMESTAMP)))


def merge_cpu_batches(streams: Iterable[Iterable[EventBatch]]) -> Iterator[EventBatch]:
    """Merge per-CPU streams of batches into one stream in the order `trace` prints events:
    by timestamp, ties going to the lower CPU.

    Each stream must be one CPU's batches in time order (what `EventDecoder.decode` gives for
    successive sub-buffers). The result is a sequence of batches, each a run of consecutive
    events of one CPU; a batch's `lost` count rides on the first run taken from it (a loss with
    no events after it comes out as an empty batch). Only the current batch of each CPU is held,
    and a stream is advanced only when its current batch is used up.
    """
    timestamp = _TIMESTAMP
    heap: list[tuple[int, int, int]] = []
    current: dict[int, tuple[list[Event], int, int]] = {}
    iterators = [iter(stream) for stream in streams]
    cpus: dict[int, int] = {}

    def load(index: int, carried: int) -> EventBatch | None:
        """Fetch the next non-empty batch of stream `index`; return a lone loss at its end."""
        lost = carried
        for batch in iterators[index]:
            cpus.setdefault(index, batch.cpu if batch.cpu is not None else index)
            lost = _add_lost(lost, batch.lost)
            if batch.events:
                current[index] = (batch.events, 0, lost)
                heapq.heappush(heap, (batch.events[0].timestamp_ns, cpus[index], index))
                return None
        current.pop(index, None)
        if lost:
            return EventBatch([], lost, cpus.get(index))
        return None

    for index in range(len(iterators)):
        lone = load(index, 0)
        if lone is not None:
            yield lone
    while heap:
        _, cpu, index = heapq.heappop(heap)
        events, first, lost = current[index]
        if heap:
            limit_ts, limit_cpu, _ = heap[0]
            find = bisect_right if cpu < limit_cpu else bisect_left
            stop = find(events, limit_ts, first + 1, len(events), key=timestamp)
        else:
            stop = len(events)
        yield EventBatch(events[first:stop] if first or stop < len(events) else events, lost, cpu)
        if stop < len(events):
            current[index] = (events, stop, 0)
            heapq.heappush(heap, (events[stop].timestamp_ns, cpu, index))
        else:
            lone = load(index, 0)
            if lone is not None:
                yield lone


def _add_lost(total: int, lost: int) -> int:
    """Sum loss counts where any unknown count (negative) makes the sum unknown."""
    if total < 0 or lost < 0:
        return -1 if (total or lost) else 0
    return total + lost
