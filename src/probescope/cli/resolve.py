"""`probescope resolve SPEC...`: print the kernel definitions a spec becomes, one per line,
exactly as the kernel prints them back in uprobe_events."""

from __future__ import annotations

import argparse
import sys

from probescope.language.model import ProbeSpec
from probescope.symbols.resolve import resolve_specs
from probescope.system.kernel import RunningKernel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="probe specs, either form")
    parser.add_argument("-p", "--pid", type=int, help="resolve targets as process PID sees them")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="say on stderr where each offset came from"
    )


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    grammar = RunningKernel.read().grammar
    for probe in resolve_specs(args.specs, pid=args.pid, grammar=grammar, notes=notes):
        print(probe.spec.definition())
        if isinstance(probe.spec, ProbeSpec) and probe.spec.filter and probe.kind.is_user:
            # uprobe_events takes no filter (it skips '#' comments): the event's `filter` file
            print(f"# filter: {probe.spec.filter}")
        if args.verbose:
            where = probe.label
            details = []
            if probe.vaddr is not None:
                details.append(f"vaddr 0x{probe.vaddr:x}")
            if probe.function_size:
                details.append(f"size {probe.function_size}")
            extra = f" ({', '.join(details)})" if details else ""
            print(f"# {probe.spec.source}: {where}{extra}", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
