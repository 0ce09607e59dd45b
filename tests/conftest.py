"""Test-wide fixtures: tracefs gating for `root` tests and the C-program builder."""

from __future__ import annotations

import pytest

from support.build import compile_program
from support.tracefs import skip_reason


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
