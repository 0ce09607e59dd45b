"""USDT probes end to end through the tracefs engine: semaphores through the kernel's (REF),
every site of a probe, arguments picked and retyped, and Python's own SDT probes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from probescope.errors import SpecError
from probescope.language.model import ProbeKind
from probescope.session import Session
from support.build import compile_program

pytestmark = pytest.mark.root

TARGETS = Path(__file__).parents[2] / "targets" / "usdt"
PYTHON = Path("/usr/bin/python3.11")


@pytest.fixture(scope="module")
def gated() -> Path:
    return compile_program((TARGETS / "usdt_gated.c").read_text(), "usdt_gated", ["-O2", "-g"])


def test_semaphore_gated_probe_fires_with_its_arguments(
    gated: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    specs = [f"usdt:{gated}:gated:hit", f"usdt:{gated}:gated:always v=arg1"]
    session = Session(specs, engine="tracefs", command=[str(gated), "4"])
    with session:
        events = list(session.events(duration=30))
    printed = capfd.readouterr().out
    hits = [e for e in events if e.name == "gated_hit"]
    assert [e.args for e in hits] == [
        (int(m.group(1)), int(m.group(2)))
        for m in re.finditer(r"gated:hit (-?\d+) (-?\d+)", printed)
    ]
    assert len(hits) == 4, "the kernel set the semaphore, so the program computed the arguments"
    always = [e.arg("v") for e in events if e.name == "gated_always"]
    assert always == [0, -1, -2, -3]
    assert all(e.kind is ProbeKind.USDT for e in events)
    assert "semaphore 1 1" in printed


def test_semaphore_is_released_after_the_session(
    gated: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import subprocess

    out = subprocess.run([str(gated), "1"], capture_output=True, text=True, check=True).stdout
    assert "gated:hit" not in out and "semaphore 0 0" in out


@pytest.mark.skipif(not PYTHON.exists(), reason="Debian's python3.11 (with SDT probes) is absent")
def test_python_import_probes_with_strings() -> None:
    specs = [f"usdt:{PYTHON}:python:import__find__load__done module=arg1:string found=arg2"]
    code = "import json, colorsys"
    session = Session(specs, engine="tracefs", command=[str(PYTHON), "-c", code])
    with session:
        events = list(session.events(duration=30))
    loaded = {e.arg("module"): e.arg("found") for e in events}
    assert loaded.get("json") == 1 and loaded.get("colorsys") == 1


def test_unknown_probe_lists_what_exists(gated: Path) -> None:
    with pytest.raises(SpecError, match="gated") as info:
        Session([f"usdt:{gated}:gated:nope"], engine="tracefs")
    assert info.value.column is not None


def test_argument_beyond_the_probe(gated: Path) -> None:
    with pytest.raises(SpecError, match="has 1 arguments"):
        Session([f"usdt:{gated}:gated:always arg2"], engine="tracefs")
