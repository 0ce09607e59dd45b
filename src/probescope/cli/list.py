"""`probescope list tracepoints|functions|kfunctions|usdt ...`: what can be probed here."""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import sys

from probescope.cli._tracefs_access import tracefs_for
from probescope.engines.tracefs.static_plan import (
    available_functions,
    list_tracepoints,
    read_format,
)
from probescope.errors import ProbescopeError

# what -> (module with add_arguments/run, help); `usdt` lives in its own module.
_EXTERNAL: dict[str, tuple[str, str]] = {
    "usdt": ("probescope.cli.list_usdt", "USDT probes of a binary: sites, semaphores, fetchargs")
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="what", metavar="WHAT")
    kinds.required = True
    tracepoints = kinds.add_parser("tracepoints", help="kernel trace events and their fields")
    tracepoints.add_argument("glob", nargs="?", default="*", metavar="[SYSTEM:]EVENT-GLOB")
    tracepoints.add_argument(
        "-v", "--verbose", action="store_true", help="show fields with types, offsets, sizes"
    )
    tracepoints.set_defaults(list_run=_tracepoints)
    for name, help_text in (
        ("functions", "kernel functions the function tracer can trace"),
        ("kfunctions", "kernel functions kprobes can probe"),
    ):
        sub = kinds.add_parser(name, help=help_text)
        sub.add_argument("glob", nargs="?", default="*", metavar="GLOB")
        sub.set_defaults(list_run=_functions)
    for name, (module_name, help_text) in _EXTERNAL.items():
        sub = kinds.add_parser(name, help=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(list_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args.list_run(args))


def _tracepoints(args: argparse.Namespace) -> int:
    tracefs = tracefs_for("listing tracepoints")
    system_glob, _, event_glob = args.glob.rpartition(":")
    system_glob = system_glob or "*"
    found = 0
    for system, event in list_tracepoints(tracefs):
        if not (
            fnmatch.fnmatchcase(system, system_glob) and fnmatch.fnmatchcase(event, event_glob)
        ):
            continue
        found += 1
        event_format = read_format(tracefs, system, event)
        if args.verbose:
            print(f"tracepoint:{system}:{event}")
            for field in event_format.fields:
                sign = "signed" if field.signed else "unsigned"
                print(
                    f"    {field.type} {field.name}"
                    + (f"[{field.array_length}]" if field.array_length else "")
                    + f";  offset {field.offset}, size {field.size}, {sign}"
                )
        else:
            fields = ", ".join(f.name for f in event_format.fields)
            print(f"tracepoint:{system}:{event}  ({fields})")
    if not found:
        print(f"no tracepoint matches {args.glob!r}", file=sys.stderr)
        return 1
    return 0


def _functions(args: argparse.Namespace) -> int:
    tracefs = tracefs_for("listing kernel functions")
    try:
        entries = available_functions(tracefs)
    except ProbescopeError:
        if args.what != "kfunctions":
            raise
        entries = _kallsyms_functions()
    prefix = "function" if args.what == "functions" else "kprobe"
    found = 0
    for entry in entries:
        name, _, module = entry.partition(" ")
        if fnmatch.fnmatchcase(name, args.glob):
            found += 1
            print(f"{prefix}:{name}" + (f" {module}" if module else ""))
    if not found:
        print(f"no kernel function matches {args.glob!r}", file=sys.stderr)
        return 1
    return 0


def _kallsyms_functions() -> list[str]:
    """Text symbols of /proc/kallsyms, for kernels that refuse available_filter_functions."""
    entries = []
    with open("/proc/kallsyms") as kallsyms:
        for line in kallsyms:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in ("t", "T"):
                entries.append(parts[2] + (f" {parts[3]}" if len(parts) > 3 else ""))
    return entries
