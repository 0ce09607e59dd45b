"""The running kernel as probescope sees it: its release, the probe grammar it accepts, its CPUs
and its lockdown mode — read once into a `RunningKernel` value and passed to whoever needs it.

Apart from the tracefs engine so that `probescope resolve`, which needs the grammar but no tracefs
I/O, does not import subprocess, pathlib and the ring-buffer machinery.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from probescope.language.kernel_features import KernelGrammar

TRACEFS_MOUNTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
LOCKDOWN_PATH = "/sys/kernel/security/lockdown"
POSSIBLE_CPUS_PATH = "/sys/devices/system/cpu/possible"


@dataclass(frozen=True)
class RunningKernel:
    """What probescope needs to know of the kernel it runs on, as read at one moment.

    `grammar` is what its probe grammar accepts: its release plus the types its own tracefs README
    lists (when tracefs is readable). `lockdown` is `none`, `integrity`, `confidentiality` or None
    when the kernel does not say.
    """

    release: str
    grammar: KernelGrammar
    possible_cpus: int | None
    lockdown: str | None

    @classmethod
    def read(cls) -> RunningKernel:
        """Read the running kernel's facts now (a few small files; no caching: call it once
        per session and pass the value on)."""
        release = os.uname().release
        cpus = possible_cpus()
        return cls(
            release=release,
            grammar=KernelGrammar.for_release(release, _tracefs_readme(), possible_cpus=cpus),
            possible_cpus=cpus,
            lockdown=lockdown_state(),
        )


def _tracefs_readme() -> str | None:
    for root in TRACEFS_MOUNTS:
        try:
            with open(os.path.join(root, "README"), encoding="utf-8", errors="replace") as file:
                return file.read()
        except OSError:
            continue
    return None


def possible_cpus() -> int | None:
    """Count of /sys/devices/system/cpu/possible (`0-3,8-11` style ranges)."""
    try:
        with open(POSSIBLE_CPUS_PATH, encoding="ascii") as file:
            text = file.read().strip()
    except (OSError, ValueError):
        return None
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def lockdown_state() -> str | None:
    """The kernel lockdown mode (`none`, `integrity`, `confidentiality`) if known."""
    try:
        with open(LOCKDOWN_PATH, encoding="ascii") as file:
            text = file.read()
    except (OSError, ValueError):
        return None
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return None
