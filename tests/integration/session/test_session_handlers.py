"""`Session.on(spec, fn)`: Python handlers at each hit, through the public API (ptrace engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probescope.errors import ProbescopeError
from probescope.session import Session
from support.build import compile_program

TARGETS = Path(__file__).parents[2] / "targets" / "ptrace"


@pytest.fixture(scope="module")
def malloc_demo() -> Path:
    return compile_program((TARGETS / "malloc.c").read_text(), "malloc", ("-O0", "-g"))


def test_fault_injection_third_malloc_returns_null(
    malloc_demo: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def fail_third(ctx: object) -> None:
        calls.append(ctx.arg("size"))  # type: ignore[attr-defined]
        if len(calls) == 3:
            ctx.override_return(0)  # type: ignore[attr-defined]

    session = Session(command=[str(malloc_demo)])
    session.on("c:malloc size=arg1:u64", fail_third)
    with session:
        events = list(session.events(duration=60))
    out = capfd.readouterr().out
    assert session.engine is not None and session.engine.name == "ptrace"
    assert calls[:5] == [1000, 2000, 3000, 4000, 5000]
    assert "malloc #3 (3000 bytes): NULL" in out
    assert "malloc #2 (2000 bytes): ok" in out and "malloc #4 (4000 bytes): ok" in out
    assert [e.arg("size") for e in events if e.name == "malloc"][:5] == calls[:5]
    stats = session.summary().stats
    assert stats is not None and stats.command_status == 1


def test_handlers_need_the_ptrace_engine(malloc_demo: Path) -> None:
    session = Session(command=[str(malloc_demo)], engine="tracefs")
    session.on("c:malloc", lambda ctx: None)
    with pytest.raises(ProbescopeError, match="ptrace engine"):
        session.start()
    session.close()
