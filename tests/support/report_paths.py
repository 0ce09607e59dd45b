"""The `report_path` fixture: a test of text output from a recording runs once through the
compiled report loop and once through pure Python (switched by `PROBESCOPE_NO_ACCEL`, as a
user would), and fails if the compiled run did not take the compiled loop."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from probescope.sinks import text_program
from probescope.traceevent.accel import DISABLE_VARIABLE, accelerated

REPORT_PATHS = ("compiled", "python")


def compiler_present() -> bool:
    return any(shutil.which(name) for name in ("cc", "gcc"))


@pytest.fixture(params=REPORT_PATHS)
def report_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    path: str = request.param
    if path == "python":
        monkeypatch.setenv(DISABLE_VARIABLE, "1")
    else:
        monkeypatch.delenv(DISABLE_VARIABLE, raising=False)
        if not accelerated():
            if compiler_present():
                pytest.fail("the report accelerator is not built: run pip install -e . again")
            pytest.skip("no C compiler here: the report accelerator is not built")
    taken: list[bool] = []
    fast_path = text_program._fast_path

    def watched(*args: Any) -> tuple[int, int] | None:
        result = fast_path(*args)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(text_program, "_fast_path", watched)
    yield path
    assert taken == [path == "compiled"] * len(taken), f"the {path} path was not the one taken"
