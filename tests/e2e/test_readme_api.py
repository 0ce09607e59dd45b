"""README's Python API section, run exactly as written: every ```python block of it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"


def api_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Python API") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_section_has_examples() -> None:
    blocks = api_blocks()
    assert len(blocks) >= 2
    assert all("from probescope import" in block for block in blocks)


@pytest.mark.root
@pytest.mark.parametrize("index", range(len(api_blocks())))
def test_example_runs_as_written(index: int) -> None:
    result = subprocess.run(
        [sys.executable, "-c", api_blocks()[index]], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) >= 2, result.stdout
    if index == 0:
        # malloc entries and returns of /bin/ls, with the argument named in the spec.
        assert any(line.startswith("malloc ") and "'size':" in line for line in lines)
        assert any(line.startswith("malloc__return ") and "'ptr':" in line for line in lines)
    else:
        # The kernel-format text of the exec, getenv lines, then the summary of a clean end.
        assert any("sched_process_exec: filename=/usr/bin/env" in line for line in lines)
        assert lines[-1].endswith("events; command exited with 0")
