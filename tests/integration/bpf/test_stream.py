"""The bpf engine's stream under load: a recorder process keeps the ring buffer empty while
the decoder is slower than the program (nothing lost), events come out in exact time order
across CPUs, and what a session ended early had recorded but not decoded is said."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from integration.bpf.harness import TARGETS
from probescope.engines.base import EngineOptions
from probescope.session import Session

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def hammer(build: Callable[..., Path]) -> Path:
    return build((TARGETS / "hammer.c").read_text(), "hammer", ("-O0", "-pthread"))


def test_events_are_in_time_order_across_cpus(hammer: Path) -> None:
    threads, calls = 2 * (os.cpu_count() or 1), 50000
    specs = [
        f"{hammer}:hit t=arg1:s64 i=arg2:s64",
        f"{hammer}:hit%return r=retval:s64 c=$comm:string",
    ]
    session = Session(specs, engine="bpf", command=[str(hammer), str(threads), str(calls)])
    with session:
        stamps, cpus, order = [], set(), {}
        for event in session.events(duration=120):
            stamps.append(event.timestamp_ns)
            cpus.add(event.cpu)
            if event.name == "hit":
                thread, i = event.arg("t"), event.arg("i")
                assert order.get(thread, -1) == i - 1, "a thread's own calls in program order"
                order[thread] = i
    summary = session.summary()
    assert summary.lost == 0
    assert len(stamps) == 2 * threads * calls
    assert all(a <= b for a, b in itertools.pairwise(stamps))
    if (os.cpu_count() or 1) > 1:
        assert len(cpus) > 1, "the threads ran on one CPU: the test proved nothing"


def test_a_slow_decoder_loses_nothing(hammer: Path) -> None:
    """A ring of 4 MiB holds ~58,000 records; the program writes 600,000 as fast as it can
    while the consumer sleeps between batches: the recorder copies the ring into the spool
    and the decoder reads the spool behind it."""
    session = Session(
        [f"{hammer}:hit t=arg1:s64 i=arg2:s64"],
        engine="bpf",
        command=[str(hammer), "2", "300000"],
        options=EngineOptions(buffer_size_kb=4096 // (os.cpu_count() or 1)),
    )
    with session:
        received = 0
        for batch in session.batches(duration=300):
            received += len(batch.events)
            if batch.events:
                time.sleep(0.05)
    summary = session.summary()
    assert (received, summary.lost) == (600000, 0)
    assert summary.stats is not None
    assert summary.stats.extra["spool_peak_bytes"] > 4 << 20, "the decoder never fell behind"
    assert summary.stats.extra["undelivered"] == 0


def test_a_session_ended_early_says_what_it_did_not_decode(hammer: Path) -> None:
    session = Session(
        [f"{hammer}:hit t=arg1:s64 i=arg2:s64"],
        engine="bpf",
        command=[str(hammer), "2", "200000"],
    )
    summary = session.run(count=1000)
    assert summary.reason == "1000 events" and summary.total == 1000
    assert summary.stats is not None
    undelivered = summary.stats.extra["undelivered"]
    assert undelivered > 0
    assert any(f"{undelivered} records recorded but not decoded" in n for n in summary.stats.notes)
    assert undelivered + summary.total + summary.lost <= 400000
