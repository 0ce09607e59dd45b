"""All tracefs I/O goes through one class: a tracefs directory (the mount or an instance) and
its four primitives — read, write, append, exists — so unit tests can point it at a tmp tree.

Dynamic-event command files are only ever opened O_WRONLY|O_APPEND: opening them with O_TRUNC
deletes every event of that type on the machine (mechanisms.md §1.1), and Python's "a" mode
seeks, which tracefs refuses.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from probescope.engines.tracefs.errorlog import ErrorLogEntry, parse_error_log
from probescope.errors import EngineUnavailable, TracefsError
from probescope.system.kernel import TRACEFS_MOUNTS

MOUNT_POINTS = tuple(Path(mount) for mount in TRACEFS_MOUNTS)


class Tracefs:
    """A tracefs directory: the top of the mount, or an instance under `instances/`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    # -- the four primitives --------------------------------------------------------------

    def read(self, name: str) -> str:
        try:
            return (self.root / name).read_text()
        except OSError as error:
            raise self._error("read", name, error) from None

    def write(self, name: str, text: str) -> None:
        """Replace the content of a control file (`enable`, `trace_clock`, `set_event_pid`)."""
        self._write(name, text, os.O_WRONLY | os.O_TRUNC)

    def append(self, name: str, text: str) -> None:
        """Append commands to a command file (`uprobe_events`, `dynamic_events`)."""
        self._write(name, text, os.O_WRONLY | os.O_APPEND)

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    # -------------------------------------------------------------------------------------

    def _write(self, name: str, text: str, flags: int) -> None:
        path = self.root / name
        try:
            fd = os.open(path, flags)
        except OSError as error:
            raise self._error("open", name, error) from None
        try:
            data = text.encode()
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as error:
            raise self._error("write", name, error) from None
        finally:
            os.close(fd)

    def _error(self, action: str, name: str, error: OSError) -> TracefsError:
        reason = os.strerror(error.errno) if error.errno else str(error)
        hint = None
        if error.errno == errno.EPERM:
            hint = "the kernel refuses this file here (lockdown, or a feature disabled)"
        elif error.errno == errno.EACCES:
            hint = "tracefs needs root (or CAP_SYS_ADMIN/CAP_PERFMON and matching permissions)"
        elif error.errno == errno.EBUSY:
            hint = "the event is enabled somewhere; disable it first"
        return TracefsError(
            f"cannot {action} {self.root / name}: {reason}", hint=hint, path=str(self.root / name)
        )

    def error_log(self) -> list[ErrorLogEntry]:
        if not self.exists("error_log"):
            return []
        return parse_error_log(self.read("error_log"))

    def clear_error_log(self) -> None:
        if self.exists("error_log"):
            self.write("error_log", "")

    def list_dir(self, name: str) -> list[str]:
        try:
            return sorted(os.listdir(self.root / name))
        except (FileNotFoundError, NotADirectoryError):
            return []

    @classmethod
    def discover(cls, *, mount: bool = True) -> Tracefs:
        """The mounted tracefs, mounting it when root and absent; EngineUnavailable says why not."""
        for candidate in MOUNT_POINTS:
            try:
                present = (candidate / "trace").exists()
            except PermissionError:  # the mount's directory is closed to this user
                raise EngineUnavailable(
                    f"{candidate} is not accessible: not root",
                    hint="run as root, or use --engine bpf (CAP_BPF+CAP_PERFMON) or ptrace",
                ) from None
            if present:
                return cls._checked(candidate)
        if mount and os.geteuid() == 0:
            target = MOUNT_POINTS[0]
            result = subprocess.run(
                ["mount", "-t", "tracefs", "nodev", str(target)],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode == 0 and (target / "trace").exists():
                return cls._checked(target)
            raise EngineUnavailable(
                f"tracefs is not mounted and mounting it failed: {result.stderr.strip()}",
                hint="is CONFIG_TRACING enabled? try: mount -t tracefs nodev /sys/kernel/tracing",
            )
        if os.geteuid() != 0:
            raise EngineUnavailable(
                "tracefs is not accessible: not root",
                hint="run as root, or use --engine ptrace to trace your own processes",
            )
        raise EngineUnavailable(
            "tracefs is not mounted", hint="mount -t tracefs nodev /sys/kernel/tracing"
        )

    @classmethod
    def _checked(cls, root: Path) -> Tracefs:
        if not os.access(root / "trace", os.R_OK):
            raise EngineUnavailable(
                f"{root} is not readable: not root",
                hint="run as root, or use --engine ptrace to trace your own processes",
            )
        return cls(root)


def lines_of(text: str) -> Iterable[str]:
    return (line for line in text.splitlines() if line and not line.startswith("#"))
