"""Test-wide fixtures: tracefs gating for `root` tests and the C-program builder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.build import compile_program  # noqa: E402
from support.tracefs import skip_reason  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=reason)
    for item in items:
        if "root" in item.keywords:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def build():
    """`build(source, name, flags=...)` compiles a C program and returns its path."""
    return compile_program
