"""`probescope resolve SPEC...`: print the kernel definitions a spec becomes, one per line,
exactly as the kernel prints them back in uprobe_events."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from probescope.language.go_strings import KERNEL_CANNOT, kernel_inexpressible
from probescope.language.model import FetchArg, GoString, ProbeSpec
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
        spec = probe.spec
        engine_only = kernel_inexpressible(spec.args) if isinstance(spec, ProbeSpec) else []
        if isinstance(spec, ProbeSpec) and engine_only:
            # the line without them; each as a comment (uprobe_events skips '#' lines)
            spec = replace(spec, args=tuple(a for a in spec.args if a not in engine_only))
        print(spec.definition())
        for arg in engine_only:
            print(f"# {arg}: {_engine_read(arg)}")
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


def _engine_read(arg: FetchArg) -> str:
    fetch = arg.fetch
    if isinstance(fetch, GoString):
        what = f"a Go string, pointer {fetch.pointer} and length {fetch.length}"
    else:
        what = "a Go string"
    return f"{what}; {KERNEL_CANNOT} (--engine bpf or --engine ptrace read it)"
