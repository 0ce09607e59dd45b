"""Where tracefs is, whether tests may use it, and what probescope left behind in it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")


def tracefs_root() -> Path | None:
    """The mounted tracefs, mounting it when root; None when it cannot be had."""
    if (TRACEFS / "uprobe_events").exists():
        return TRACEFS
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True)
        if (TRACEFS / "uprobe_events").exists():
            return TRACEFS
    debugfs = Path("/sys/kernel/debug/tracing")
    if (debugfs / "uprobe_events").exists():
        return debugfs
    return None


def skip_reason() -> str | None:
    """Why root+tracefs tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root for tracefs"
    root = tracefs_root()
    if root is None:
        return "tracefs with uprobe_events is not available (CONFIG_UPROBE_EVENTS?)"
    if not os.access(root / "uprobe_events", os.W_OK):
        return "uprobe_events is not writable"
    return None


def leftovers(root: Path | None = None) -> list[str]:
    """probescope dynamic events and instances present in tracefs."""
    root = root or tracefs_root()
    if root is None:
        return []
    found: list[str] = []
    for name in ("dynamic_events", "uprobe_events"):
        path = root / name
        if path.exists():
            found += [line for line in path.read_text().splitlines() if "probescope" in line]
    instances = root / "instances"
    if instances.is_dir():
        found += [f"instance {p.name}" for p in instances.iterdir() if "probescope" in p.name]
    return sorted(set(found))


def append(path: Path, text: str) -> None:
    """Append commands to a tracefs command file by hand (an oracle independent of the engine):
    O_WRONLY|O_APPEND — never O_TRUNC, which would delete every event of that type, and not
    Python's "a" mode, whose seek tracefs refuses (mechanisms.md §1.1)."""
    _write(path, text, os.O_WRONLY | os.O_APPEND)


def write(path: Path, text: str) -> None:
    """Replace the content of a tracefs control file (`enable`, `set_event_pid`, ...)."""
    _write(path, text, os.O_WRONLY | os.O_TRUNC)


def _write(path: Path, text: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
