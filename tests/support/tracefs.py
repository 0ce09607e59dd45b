"""Where tracefs is, whether tests may use it, and what probescope left behind in it."""

from __future__ import annotations

import contextlib
import os
import re
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


def watchdog_of(session_pid: int) -> int | None:
    """The pid of the tracefs watchdog (`probescope-wd`) watching `session_pid`, found by the
    pidfd it holds (`Pid:` in its fdinfo) while the session lives."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "probescope-wd":
                continue
            for info in (entry / "fdinfo").iterdir():
                for line in info.read_text().splitlines():
                    if line.startswith("Pid:") and line.split()[1] == str(session_pid):
                        return int(entry.name)
        except OSError:
            continue
    return None


def owned_by(pid: int) -> list[str]:
    """What `leftovers()` lists of the session of process `pid` (names carry the owner)."""
    return [
        line for line in leftovers() if f"probescope_{pid}_" in line or f"probescope-{pid}-" in line
    ]


def session_armed(pid: int, root: Path | None = None) -> bool:
    """Whether the tracefs session of process `pid` has its probes enabled (its instance
    exists and an event group of its own in it is enabled)."""
    root = root or tracefs_root()
    if root is None:
        return False
    for instance in (root / "instances").glob(f"probescope-{pid}-*"):
        for enable in instance.glob(f"events/probescope_{pid}_*/enable"):
            try:
                if enable.read_text().strip() not in ("0", ""):
                    return True
            except OSError:
                continue
    return False


def wait_until_armed(pid: int, timeout: float = 60.0) -> None:
    """Wait until `session_armed(pid)`; AssertionError after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not session_armed(pid):
        assert time.monotonic() < deadline, f"the session of {pid} never armed its probes"
        time.sleep(0.02)


def trace_cmd_extract(trace_cmd: str, instance: str, out: Path) -> subprocess.CompletedProcess[str]:
    """`trace-cmd extract -B INSTANCE -o OUT`, again (up to 3 times) when it failed on the size
    of /proc/kallsyms: it stats the file and then reads it, and a BPF program loaded or freed
    in between (the kernel names each in kallsyms) changes the size under it."""
    for _ in range(3):
        extracted = subprocess.run(
            [trace_cmd, "extract", "-B", instance, "-o", str(out)], capture_output=True, text=True
        )
        if extracted.returncode == 0 or "/proc/kallsyms" not in extracted.stderr:
            break
    return extracted


def trace_cmd_recording(
    trace_cmd: str,
    out: Path,
    definitions: dict[str, str],
    argv: list[str],
    *,
    tag: str,
    settings: dict[str, str] | None = None,
    tracepoints: tuple[str, ...] = (),
) -> str:
    """A trace.dat that trace-cmd wrote (`trace-cmd record` itself cannot run here: it enables
    the function tracer, which this kernel refuses; `extract` reads an instance): the uprobes of
    `definitions` (event name → a `probescope resolve` line) in a group of this process,
    enabled in a private instance with `settings` (file → value, e.g. trace_clock or
    options/userstacktrace) and `tracepoints` (system/event) while `argv` runs, extracted into
    `out`. Everything is removed after. Returns the instance's name (trace-cmd prints it before
    each line of an instance's events)."""
    root = tracefs_root()
    assert root is not None
    group, instance = f"{tag}_{os.getpid()}", f"{tag}-{os.getpid()}"
    inst = root / "instances" / instance
    inst.mkdir()
    try:
        for name, line in definitions.items():
            append(root / "uprobe_events", re.sub(r"^([pr])(:\S+)? ", rf"\1:{group}/{name} ", line))
        for path, value in (settings or {}).items():
            (inst / path).write_text(value)
        (inst / "events" / group / "enable").write_text("1")
        for tracepoint in tracepoints:
            (inst / "events" / tracepoint / "enable").write_text("1")
        subprocess.run(argv, check=True, capture_output=True)
        (inst / "tracing_on").write_text("0")
        extracted = trace_cmd_extract(trace_cmd, instance, out)
        assert extracted.returncode == 0, extracted.stderr
    finally:
        if inst.exists():
            inst.rmdir()
        for name in definitions:
            with contextlib.suppress(OSError):
                append(root / "uprobe_events", f"-:{group}/{name}")
    return instance
