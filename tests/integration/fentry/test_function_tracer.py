"""`probescope trace -c PROG 'f:PROG:GLOB'`: the user-space function tracer prints the kernel's
function-tracer lines (`comm-pid [cpu] ..... ts: func <-caller`) with the program's symbols."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .harness import requires_fentry, target

pytestmark = [pytest.mark.root, requires_fentry]

LINE = re.compile(r"^\s*calls-(\d+)\s+\[\d{3}\] \.\.\.\.\. +\d+\.\d{6}: (.*)$")


def test_function_tracer_lines() -> None:
    path = target("calls.c", ("-O0", "-g"))
    done = subprocess.run(
        [sys.executable, "-m", "probescope", "trace", "-c", str(path), f"f:{path}:[fgm]*"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "12"  # the program's own output
    bodies = []
    for line in lines[1:]:
        match = LINE.match(line)
        assert match, line
        bodies.append(match.group(2))
    assert bodies == ["main <-__libc_start_call_main"] + ["g <-main", "f <-g"] * 3
    assert "fentry engine" in done.stderr
