"""Fixtures for aggregation tests: the compiled targets, and nothing left in tracefs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.build import compile_program
from support.tracefs import leftovers

TARGETS = Path(__file__).parents[2] / "targets" / "aggregate"


def bpf_reason() -> str | None:
    """Why the bpf engine cannot run here (None when it can)."""
    from probescope.engines.registry import BY_NAME, availability

    state = availability(BY_NAME["bpf"])
    return None if state.ok else state.reason


ENGINES = [
    "tracefs",
    "ptrace",
    pytest.param("bpf", marks=pytest.mark.skipif(bpf_reason() is not None, reason="no bpf")),
]
"""Every engine computes the same values: tracefs and ptrace in user space, bpf in the kernel
(or, where a request needs every hit, in user space too)."""
AVAILABLE = ["tracefs", "ptrace", *(["bpf"] if bpf_reason() is None else [])]


def target(name: str, flags: tuple[str, ...]) -> Path:
    return compile_program((TARGETS / f"{name}.c").read_text(), name, flags)


@pytest.fixture(scope="session")
def workload() -> Path:
    return target("workload", ("-O1", "-g", "-pthread"))


@pytest.fixture(scope="session")
def callers() -> Path:
    """Built without frame pointers: only CFI can walk its stacks."""
    return target("callers", ("-O2", "-fomit-frame-pointer", "-g"))


@pytest.fixture(scope="session")
def callers_fp() -> Path:
    return target("callers", ("-O0", "-fno-omit-frame-pointer", "-g"))


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = set(leftovers())
    yield
    pid = os.getpid()
    mine = [
        line
        for line in set(leftovers()) - before
        if f"probescope_{pid}_" in line or f"probescope-{pid}-" in line
    ]
    assert mine == [], f"left behind: {mine}"
