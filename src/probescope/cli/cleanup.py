"""`probescope cleanup`: remove the tracefs instances and dynamic events that dead probescope
sessions left behind (SIGKILL, power loss); with `-p PID`, restore the code a killed fentry
session left patched in that process. `trace` does the same on start."""

from __future__ import annotations

import argparse
import sys

from probescope.engines.tracefs.reaper import find_leftovers, reap
from probescope.engines.tracefs.tracefs import Tracefs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all",
        action="store_true",
        help="also remove objects of probescope sessions that are still running",
    )
    parser.add_argument("-n", "--dry-run", action="store_true", help="list what would be removed")
    parser.add_argument(
        "-p",
        "--pid",
        type=int,
        action="append",
        default=[],
        help="restore this process's code patched by a killed fentry session (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    if args.pid:
        return _cleanup_processes(args)
    tracefs = Tracefs.discover()
    leftovers = find_leftovers(tracefs, include_alive=args.all)
    if not leftovers:
        print("nothing to clean up", file=sys.stderr)
        return 0
    for line in leftovers.describe():
        print(("would remove " if args.dry_run else "removing ") + line)
    if args.dry_run:
        return 0
    errors = reap(tracefs, leftovers)
    for error in errors:
        print(error.render(), file=sys.stderr)
    return 1 if errors else 0


def _cleanup_processes(args: argparse.Namespace) -> int:
    from probescope.engines.fentry.cleanup import cleanup_process
    from probescope.errors import ProbescopeError

    status = 0
    for pid in args.pid:
        try:
            report = cleanup_process(pid, include_alive=args.all, dry_run=args.dry_run)
        except ProbescopeError as error:
            print(f"process {pid}: {error.render()}", file=sys.stderr)
            status = 1
            continue
        for line in report.lines or [f"process {pid}: nothing to clean up"]:
            print(line)
    return status
