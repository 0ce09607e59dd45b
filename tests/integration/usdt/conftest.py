"""Live USDT tests: each test gets `live`, a LiveUsdt closed on every exit path, and fails if
anything of this process is left in tracefs afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from integration.usdt.live import GROUP, INSTANCE, LiveUsdt
from support.tracefs import leftovers, tracefs_root


@pytest.fixture
def live() -> Iterator[LiveUsdt]:
    root = tracefs_root()
    assert root is not None
    session = LiveUsdt(root)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    yield
    mine = [line for line in leftovers() if GROUP in line or INSTANCE in line]
    assert mine == [], f"left behind: {mine}"
