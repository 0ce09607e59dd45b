"""The running kernel as the probe language sees it: where tracefs lives, what grammar it takes.

Apart from tracefs.py so that `probescope resolve`, which needs the grammar but no tracefs I/O,
does not import subprocess, pathlib and the ring-buffer machinery.
"""

from __future__ import annotations

import functools
import os

from probescope.language.kernel_features import KernelGrammar

TRACEFS_MOUNTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


@functools.cache
def running_kernel_grammar() -> KernelGrammar:
    """What the running kernel's probe grammar accepts: its release plus the types its own
    tracefs README lists (when tracefs is readable)."""
    readme = None
    for root in TRACEFS_MOUNTS:
        try:
            with open(os.path.join(root, "README"), encoding="utf-8", errors="replace") as file:
                readme = file.read()
            break
        except OSError:
            continue
    return KernelGrammar.for_release(os.uname().release, readme, possible_cpus=possible_cpus())


def possible_cpus() -> int | None:
    """Count of /sys/devices/system/cpu/possible (`0-3,8-11` style ranges)."""
    try:
        with open("/sys/devices/system/cpu/possible", encoding="ascii") as file:
            text = file.read().strip()
    except (OSError, ValueError):
        return None
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count
