"""A program probescope cannot reach by its path in its own view: the ticker run from a tmpfs
mounted in a private mount namespace (`unshare -m`), so only `/proc/PID/root` holds it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.build import compile_program

TARGETS = Path(__file__).parents[1] / "targets"


def ticker() -> Path:
    return compile_program((TARGETS / "ticker.c").read_text(), "ticker", ("-O1", "-g"))


@contextmanager
def namespaced_ticker(directory: Path, delay_us: int = 2000) -> Iterator[tuple[int, str]]:
    """(pid, path) of the ticker running from a tmpfs at `directory`/private that only its own
    mount namespace sees; skips when `unshare -m` cannot run."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    mountpoint = directory / "private"
    mountpoint.mkdir()
    path = f"{mountpoint}/ticker"
    script = (
        f"mount -t tmpfs probescope-test {mountpoint} && cp {ticker()} {path} && "
        f"exec {path} -1 {delay_us}"
    )
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if process.poll() is not None:
                assert process.stderr is not None
                pytest.skip(f"unshare -m failed: {process.stderr.read().decode().strip()}")
            try:
                if os.readlink(f"/proc/{process.pid}/exe") == path:
                    break
            except OSError:
                pass
            time.sleep(0.02)
        assert not os.path.exists(path), "the tmpfs must be private to the namespace"
        yield process.pid, path
    finally:
        process.terminate()
        process.wait(timeout=10)
