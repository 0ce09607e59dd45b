"""Go strings (`NAME=argN:gostring`) traced in a real Go program: the bpf and ptrace engines give
exactly each string's bytes — empty, longer than 64 bytes, a substring of a larger string (no
NUL follows it: a NUL-terminated read would run on), UTF-8, one longer than a hit's page — in
text and JSON; the tracefs engine refuses the probe by name, and auto passes it over saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probescope.engines.base import EngineOptions
from probescope.engines.registry import BY_NAME, availability, create_engine
from probescope.errors import EngineUnavailable
from probescope.session import Session
from probescope.symbols.resolve import resolve_specs
from probescope.symbols.table import SymbolTable
from unit.symbols import language_programs as programs

pytestmark = pytest.mark.root

PAGE = os.sysconf("SC_PAGE_SIZE")
SRC = Path(__file__).parents[3] / "src"
LONG = "probescope-" * 10
EXPECTED = [
    ("hello", 1),
    ("", 2),
    (LONG, 3),
    ("gopher", 4),  # "the gopher said hello to the world"[4:10]
    ("h\u00e9llo, \u4e16\u754c", 5),
    # 5000 bytes: cut like any string to the hit's page, less the fixed part (the string's
    # 4-byte word and n's 8 bytes) and the NUL
    ("x" * (PAGE - 12 - 1), 6),
]


def _go_binary() -> Path:
    binary = programs.go()
    table = SymbolTable.for_path(binary)
    if not table.takes_go_registers(table.lookup("main.Say")):
        pytest.skip("this Go toolchain predates the register ABI")
    return binary


def _spec(binary: Path) -> str:
    return f"{binary}:main.Say s=arg1:gostring n=arg3:s64"


def _engines() -> list[str]:
    return ["bpf", "ptrace"] if availability(BY_NAME["bpf"]).ok else ["ptrace"]


@pytest.mark.parametrize("engine", ["bpf", "ptrace"])
def test_exactly_the_bytes_of_each_go_string(engine: str) -> None:
    if engine not in _engines():
        pytest.skip(f"bpf engine unavailable: {availability(BY_NAME['bpf']).reason}")
    binary = _go_binary()
    session = Session([_spec(binary)], engine=engine, command=[str(binary), "strings"])
    with session:
        events = list(session.events(duration=30))
    assert [(e.arg("s"), e.arg("n")) for e in events] == EXPECTED
    stats = session.summary().stats
    assert stats is not None and stats.command_status == 0


@pytest.mark.parametrize("engine", ["bpf", "ptrace"])
def test_printed_as_a_string_in_text_and_json(engine: str) -> None:
    if engine not in _engines():
        pytest.skip(f"bpf engine unavailable: {availability(BY_NAME['bpf']).reason}")
    binary = _go_binary()
    outputs = {}
    for fmt in ("text", "jsonl"):
        argv = ["trace", "--engine", engine, "--format", fmt, _spec(binary)]
        run = subprocess.run(
            [sys.executable, "-m", "probescope", *argv, "-c", f"{binary} strings"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        assert run.returncode == 0, run.stderr
        outputs[fmt] = [line for line in run.stdout.splitlines() if "main_Say" in line]
    text = outputs["text"]
    assert [line.split(": (0x", 1)[1].split(") ", 1)[1] for line in text[:5]] == [
        's="hello" n=1',
        's="" n=2',
        f's="{LONG}" n=3',
        's="gopher" n=4',
        's="h\u00e9llo, \u4e16\u754c" n=5',
    ]
    records = [json.loads(line) for line in outputs["jsonl"]]
    assert [(r["args"]["s"], r["args"]["n"]) for r in records] == EXPECTED


def test_tracefs_refuses_it_naming_the_probe() -> None:
    binary = _go_binary()
    with pytest.raises(EngineUnavailable) as raised:
        Session([_spec(binary)], engine="tracefs", command=[str(binary), "strings"]).start()
    message = raised.value.message
    assert message.startswith("the tracefs engine cannot run main.Say: s=arg1:gostring: ")
    assert "--engine bpf or --engine ptrace" in message


def test_auto_takes_an_engine_that_reads_it_and_says_why_tracefs_cannot() -> None:
    binary = _go_binary()
    probes = resolve_specs([_spec(binary)])
    engine = create_engine("auto", probes)
    assert engine.name == _engines()[0]  # bpf where it runs (root), else ptrace
    # where bpf passes (a trace clock it does not read), tracefs is passed over with the reason
    notes: list[str] = []
    engine = create_engine("auto", probes, options=EngineOptions(clock="global"), notes=notes)
    assert engine.name == "ptrace"
    (note,) = notes
    assert "tracefs: main.Say: s=arg1:gostring: uprobe_events reads a string up to its NUL" in note


def test_fentry_hands_a_go_string_to_ptrace_not_tracefs() -> None:
    """fentry refuses Go binaries; its fallback must be an engine that reads Go strings."""
    binary = _go_binary()
    session = Session([_spec(binary)], engine="fentry", command=[str(binary), "strings"])
    with session:
        events = list(session.events(duration=30))
    assert [(e.arg("s"), e.arg("n")) for e in events] == EXPECTED
    stats = session.summary().stats
    assert stats is not None and stats.command_status == 0
    assert any(note.startswith("ptrace, not tracefs: main.Say fetches s=") for note in stats.notes)
