"""Fixtures for the ptrace engine's tests (helpers live in harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from integration.ptrace.harness import TARGETS, ptrace_skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = ptrace_skip_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=f"ptrace engine unavailable: {reason}")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def target(build: Callable[..., Path]) -> Callable[..., Path]:
    """`target("loop.c")` compiles tests/targets/ptrace/loop.c (g++ for .cc)."""

    def compile_target(
        name: str, flags: Sequence[str] = ("-O0", "-g"), *, output: str | None = None
    ) -> Path:
        source = (TARGETS / name).read_text()
        stem = output or name.rsplit(".", 1)[0]
        language = "c++" if name.endswith(".cc") else "c"
        return build(source, stem, flags, language=language)

    return compile_target
