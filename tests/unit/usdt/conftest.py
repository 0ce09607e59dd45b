"""Every USDT test starts with empty USDT and symbol caches (on disk: a private directory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from probescope.symbols.table import clear_memory_cache
from probescope.symbols.usdt import clear_usdt_cache


@pytest.fixture(autouse=True)
def private_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PROBESCOPE_CACHE_DIR", str(tmp_path / "symbol-cache"))
    clear_usdt_cache()
    clear_memory_cache()
    yield
    clear_usdt_cache()
    clear_memory_cache()
