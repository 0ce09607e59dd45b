"""`python -m probescope ...` as the tests run it: text out (surrogateescape, as recorded bytes
may not be UTF-8), a timeout, and never a traceback."""

from __future__ import annotations

import subprocess
import sys


def probescope(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the CLI; with `check`, exit 0 is asserted (stderr is the message)."""
    result = subprocess.run(
        [sys.executable, "-m", "probescope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        errors="surrogateescape",
    )
    if check:
        assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result
