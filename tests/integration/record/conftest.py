"""Fixtures for tracefs-engine tests: compiled targets and a check that nothing is left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.build import compile_program
from support.tracefs import leftovers

TARGETS = Path(__file__).parents[2] / "targets"


def target(name: str, flags: tuple[str, ...] = ("-O1", "-g")) -> Path:
    return compile_program((TARGETS / f"{name}.c").read_text(), name, flags)


@pytest.fixture(scope="session")
def loop() -> Path:
    return target("loop")


@pytest.fixture(scope="session")
def threads() -> Path:
    return target("threads", ("-O1", "-g", "-pthread"))


@pytest.fixture(scope="session")
def forks() -> Path:
    return target("forks")


@pytest.fixture(scope="session")
def ticker() -> Path:
    return target("ticker")


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Every test must leave tracefs as it found it (as far as this process's sessions go)."""
    before = set(leftovers())
    yield
    mine = [line for line in set(leftovers()) - before if _owned_by_this_process(line)]
    assert mine == [], f"left behind: {mine}"


def _owned_by_this_process(line: str) -> bool:
    import os

    return f"probescope_{os.getpid()}_" in line or f"probescope-{os.getpid()}-" in line
