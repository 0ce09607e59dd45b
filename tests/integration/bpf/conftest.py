"""Fixtures for the bpf engine's tests: they run where this process can use BPF (and, being
`root` tests, tracefs), and skip with the kernel's own reason otherwise."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from integration.bpf.harness import TARGETS, bpf_skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = bpf_skip_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=f"bpf engine unavailable: {reason}")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def values(build: Callable[..., Path]) -> Path:
    """tests/targets/bpf/values.c: data for fetch arguments of every form."""
    return build((TARGETS / "values.c").read_text(), "values", ("-O0", "-g"))


@pytest.fixture(scope="session")
def no_aslr(build: Callable[..., Path]) -> Path:
    """A wrapper running its arguments with address randomization off."""
    return build((TARGETS.parent / "norandom.c").read_text(), "norandom", ("-O1",))
