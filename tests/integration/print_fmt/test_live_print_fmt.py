"""Live kernel: tracepoints of many systems enabled in a private instance, a workload that
makes them fire, then the instance's `trace` text against probescope's text for the same
records read from `trace_pipe_raw`. Nothing may be left in tracefs afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.print_fmt import capture
from fixtures.print_fmt.replay import compare, load_capture
from probescope.engines.tracefs.kernel_context import read_kernel_symbols, read_kernel_types

pytestmark = pytest.mark.root


def top_level_events() -> str:
    return (capture.TRACEFS / "set_event").read_text()


def test_tracepoints_print_as_the_kernel_trace(tmp_path: Path) -> None:
    before = top_level_events()
    try:
        capture.capture(tmp_path, capture.EVENTS)
    finally:
        assert capture.instance_name() not in capture.leftovers()
        assert top_level_events() == before
    symbols, types = read_kernel_symbols(), read_kernel_types()
    result = compare(load_capture(tmp_path, symbols=symbols, types=types))
    assert result.mismatched == {}, result.summary()
    assert len(result.events_matched) >= 40, result.summary()
    assert len({name.split("/")[0] for name in result.events_matched}) >= 10, result.summary()


def test_hashed_pointers_are_refused_and_the_rest_still_match(tmp_path: Path) -> None:
    events = [
        "sched/sched_switch",
        "sched/sched_process_exec",
        "timer/hrtimer_start",
        "kmem/kmalloc",
        "workqueue/workqueue_execute_start",
        "signal/signal_generate",
    ]
    capture.capture(tmp_path, events, hash_ptr=True, buffer_kb=4096)
    assert capture.instance_name() not in capture.leftovers()
    result = compare(load_capture(tmp_path, symbols=read_kernel_symbols()))
    assert result.mismatched == {}, result.summary()
    for name in ("timer/hrtimer_start", "kmem/kmalloc", "workqueue/workqueue_execute_start"):
        assert "hash-ptr" in result.refused[name].problems[0]
    assert {"sched/sched_switch", "signal/signal_generate"} <= set(result.events_matched)


def test_the_instance_is_removed_when_the_capture_fails() -> None:
    with (
        pytest.raises(RuntimeError, match="workload failed"),
        capture.private_instance(
            capture.TRACEFS, ["sched/sched_switch", "no/such_event"], hash_ptr=False, buffer_kb=64
        ) as (instance, enabled),
    ):
        assert enabled == ["sched/sched_switch"]
        assert (instance / "events/sched/sched_switch/enable").read_text().strip() == "1"
        raise RuntimeError("workload failed")
    assert capture.instance_name() not in capture.leftovers()
