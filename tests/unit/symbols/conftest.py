"""Every symbols test gets its own empty symbol cache, on disk and in memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from probescope.symbols.table import clear_memory_cache


@pytest.fixture(autouse=True)
def private_symbol_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "symbol-cache"
    monkeypatch.setenv("PROBESCOPE_CACHE_DIR", str(directory))
    clear_memory_cache()
    yield directory
    clear_memory_cache()
