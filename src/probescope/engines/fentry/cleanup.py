"""`probescope cleanup -p PID` for the fentry engine: restore a process a killed probescope left
patched (the next `trace` of that process does the same before it patches anything).

Everything comes from the process itself (restore.py reads the site tables kept in its code
areas). Areas whose owner still runs are left to it unless `include_alive`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from probescope.engines.fentry import restore as restoring
from probescope.engines.fentry.inject import process_start_time
from probescope.engines.fentry.world import StoppedProcess
from probescope.engines.ptrace import xol

_RETRIES = 50


@dataclass
class CleanupReport:
    lines: list[str] = field(default_factory=list)
    sites: int = 0
    returns: int = 0


def owner_alive(header: dict[str, int]) -> bool:
    owner = header["owner_pid"]
    return bool(owner) and process_start_time(owner) == header["start_time"]


def cleanup_process(
    pid: int, *, include_alive: bool = False, dry_run: bool = False
) -> CleanupReport:
    report = CleanupReport()
    for _ in range(_RETRIES):
        if not _cleanup_once(pid, report, include_alive, dry_run):
            break
        time.sleep(0.001)  # a thread was inside a stub: let it out, then unmap
    return report


def _cleanup_once(pid: int, report: CleanupReport, include_alive: bool, dry_run: bool) -> bool:
    """One pass; True when it should be tried again."""
    report.lines.clear()
    with StoppedProcess(pid).stop() as world:
        areas = restoring.find_areas(world)
        chosen = [a for a in areas if include_alive or not owner_alive(a.header)]
        for area in areas:
            alive = owner_alive(area.header)
            verb = "would restore" if dry_run else "restoring"
            if area not in chosen:
                verb = "leaving (its probescope still runs)"
            report.lines.append(
                f"{verb} process {pid}: code area at {area.start:#x} with "
                f"{area.header['sites']} sites of probescope {area.header['owner_pid']}"
                + ("" if alive else " (gone)")
            )
        if dry_run or not chosen:
            return False
        outcome = restoring.restore(
            world,
            xol.SyscallInjector(),
            lambda header: include_alive or not owner_alive(header),
        )
        report.sites += outcome.sites
        report.returns += outcome.returns
        report.lines.append(
            f"process {pid}: {report.sites} sites and {report.returns} return addresses "
            "restored" + ("" if outcome.unmapped else f"; areas kept: {outcome.kept_because}")
        )
        report.lines += outcome.notes
        return not outcome.unmapped and "running code" in (outcome.kept_because or "")
