"""Exact counts and histograms on a program with known calls, from both engines (the tracefs
engine aggregates ring-buffer records in place, the ptrace engine goes event by event)."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.aggregate.conftest import AVAILABLE, ENGINES
from probescope.aggregate.values import Count, Histogram, LinearScale
from probescope.aggregations import count, histogram

pytestmark = pytest.mark.root


def counts(result_map: object) -> dict[tuple[object, ...], int]:
    return result_map.counts()  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("engine", ENGINES)
def test_count_by_probe(engine: str, workload: Path) -> None:
    result = count(
        [f"{workload}:alpha", f"{workload}:beta"], command=[str(workload)], engine=engine
    )
    assert result.first.key_names == ("probe",)
    assert counts(result.first) == {("alpha",): 160, ("beta",): 37}
    assert all(isinstance(v, Count) for _, v in result.first.items())


@pytest.mark.parametrize("engine", ENGINES)
def test_count_per_thread_and_process(engine: str, workload: Path) -> None:
    by_tid = count([f"{workload}:alpha"], by=["tid"], command=[str(workload)], engine=engine)
    assert sorted(counts(by_tid.first).values()) == [10, 20, 30, 100]
    by_task = count(
        [f"{workload}:alpha"], by=["comm", "pid", "cpu"], command=[str(workload)], engine=engine
    )
    per_process: dict[tuple[object, ...], int] = {}
    for (comm, pid, cpu), n in counts(by_task.first).items():
        assert isinstance(cpu, int) and cpu >= 0
        per_process[(comm, pid)] = per_process.get((comm, pid), 0) + n
    assert list(per_process.values()) == [160]
    assert next(iter(per_process))[0] == "workload"


@pytest.mark.parametrize("engine", ENGINES)
def test_count_by_named_argument(engine: str, workload: Path) -> None:
    result = count(
        [f"{workload}:beta x=arg1:s32"], by=["x"], command=[str(workload), "hist"], engine=engine
    )
    expected = {(v,): 1 for v in range(64)} | {(-5,): 3}
    assert counts(result.first) == expected


LOG2_BUCKETS = {0: 3, 1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 16, 7: 32}
"""beta(0..63) and beta(-5) ×3 in bpftrace's log2 buckets: (..., 0), [0], [1], [2, 4) ..."""


@pytest.mark.parametrize("engine", ENGINES)
def test_log2_histogram_of_an_argument(engine: str, workload: Path) -> None:
    result = histogram(
        [f"{workload}:beta x=arg1:s32"], "x", command=[str(workload), "hist"], engine=engine
    )
    ((key, value),) = result.first.items()
    assert key == ()
    assert isinstance(value, Histogram)
    assert value.buckets == LOG2_BUCKETS
    assert (value.count, value.min, value.max, value.total) == (67, -5, 63, 2016 - 15)


@pytest.mark.parametrize("engine", ENGINES)
def test_linear_histogram_of_return_values(engine: str, workload: Path) -> None:
    result = histogram(
        [f"r:{workload}:beta ret=retval:s32"],
        "ret",
        scale=LinearScale(0, 128, 32),
        command=[str(workload), "hist"],
        engine=engine,
    )
    ((_, value),) = result.first.items()
    assert isinstance(value, Histogram)
    # returns 0, 2, ..., 126 and -10 three times
    assert value.buckets == {0: 3, 1: 16, 2: 16, 3: 16, 4: 16}


@pytest.mark.parametrize("engine", ENGINES)
def test_abi_argument_and_return_value_fetched_for_you(engine: str, workload: Path) -> None:
    """`arg1` and `retval` the spec does not name are fetched as 64-bit registers, as
    bpftrace's arg0/retval are: an int -5 reads as 0xfffffffb."""
    by_argument = histogram(
        [f"{workload}:beta"], "arg1", command=[str(workload), "hist"], engine=engine
    )
    ((_, value),) = by_argument.first.items()
    assert isinstance(value, Histogram)
    assert value.count == 67 and value.buckets[33] == 3 and value.max == 0xFFFFFFFB
    by_return = count(
        [f"r:{workload}:beta"], by=["retval"], command=[str(workload), "hist"], engine=engine
    )
    assert by_return.first.counts()[(0xFFFFFFF6,)] == 3
    assert by_return.first.counts()[(126,)] == 1


def test_engines_agree_on_keys_by_probe_and_argument(workload: Path) -> None:
    specs = [f"{workload}:beta v=arg1:s32", f"{workload}:alpha"]
    results = [
        count(specs, by=["probe", "v"], command=[str(workload), "counts"], engine=engine)
        for engine in AVAILABLE
    ]
    for result in results[1:]:
        assert counts(result.first) == counts(results[0].first)
    assert sum(counts(results[0].first).values()) == 197
