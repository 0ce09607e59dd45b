"""The reference for user stacks: `perf record --call-graph dwarf` + `perf script` on the same
workload, with perf's frames named the way probescope names them (the function of the symbol
table that holds the address), so the comparison is about unwinding, not about aliases."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from probescope.aggregate.values import Stack
from probescope.errors import SymbolError
from probescope.symbols.table import SymbolTable

Names = tuple[tuple[str, str], ...]
UNKNOWN = "?"
END_MARK = (1 << 64) - 1
"""An address no symbol names (perf's `[unknown]`; probescope's hexadecimal offset)."""


def perf_skip_reason() -> str | None:
    if shutil.which("perf") is None:
        return "perf is not installed (linux-perf)"
    return None


def perf_stacks(binary: str, function: str, argv: list[str], *, stack_size: int) -> Counter[Names]:
    """Stacks of `binary:function` under `argv`, innermost first, as perf unwinds them (run
    the program itself: perf 6.1 loses the maps of a program exec'd by the one it started)."""
    event = f"psagg{os.getpid()}"
    group = "probe_" + "".join(c if c.isalnum() else "_" for c in Path(binary).name.split(".")[0])
    with tempfile.TemporaryDirectory() as tmp:
        added = subprocess.run(
            ["perf", "probe", "-q", "-x", binary, "-a", f"{event}={function}"],
            capture_output=True,
            text=True,
        )
        if added.returncode:
            raise RuntimeError(f"perf probe failed: {added.stderr.strip()}")
        try:
            data = os.path.join(tmp, "perf.data")
            recorded = subprocess.run(
                [
                    "perf",
                    "record",
                    "-q",
                    "-o",
                    data,
                    "-e",
                    f"{group}:{event}",
                    "--call-graph",
                    f"dwarf,{stack_size}",
                    "--",
                    *argv,
                ],
                capture_output=True,
                text=True,
            )
            if recorded.returncode:
                raise RuntimeError(f"perf record failed: {recorded.stderr.strip()}")
            script = subprocess.run(
                ["perf", "script", "-i", data, "-F", "ip,sym,dso", "--no-inline"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        finally:
            subprocess.run(["perf", "probe", "-q", "-d", f"{group}:{event}"], capture_output=True)
    return Counter(_samples(script))


def _samples(script: str) -> list[Names]:
    samples: list[Names] = []
    frames: list[tuple[str, str]] = []
    for line in [*script.splitlines(), ""]:
        words = line.split()
        if not words:
            if frames:
                samples.append(tuple(frames))
            frames = []
            continue
        if "(inlined)" in line or int(words[0], 16) == END_MARK:
            continue  # perf ends a walk that ran off its copy of the stack with a -1 frame
        dso = words[-1].strip("()")
        frames.append((os.path.basename(dso), _function(dso, int(words[0], 16))))
    return samples


def _function(dso: str, offset: int) -> str:
    """The name probescope gives file offset `offset` of `dso` (what perf script prints as a
    frame's address: the address relative to the file's mapping)."""
    try:
        table = SymbolTable.for_path(dso)
    except SymbolError:
        return UNKNOWN
    function = table.function_at_offset(offset)
    return function.name if function is not None else UNKNOWN


def names(stack: Stack) -> Names:
    """probescope's frames as (file name, function)."""
    return tuple((os.path.basename(frame.module), _known(frame.function)) for frame in stack)


def _known(function: str) -> str:
    return UNKNOWN if function.startswith("0x") else function


def innermost(counter: Counter[Names], depth: int) -> Counter[Names]:
    result: Counter[Names] = Counter()
    for stack, n in counter.items():
        result[stack[:depth]] += n
    return result
