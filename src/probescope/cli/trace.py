"""`probescope trace SPEC...`: install probes, stream their events to a sink, report, and
leave nothing behind — on a normal end, Ctrl-C, SIGTERM/SIGHUP, or an error in the sink."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from typing import IO, Any

from probescope.engines.base import EngineOptions
from probescope.engines.registry import ENGINE_CHOICES
from probescope.session import Session, Summary
from probescope.sinks.base import open_sink, output_format, output_formats
from probescope.symbols.resolve import resolve_specs
from probescope.system.kernel import RunningKernel


def add_arguments(parser: argparse.ArgumentParser, *, outputs: bool = True) -> None:
    """`trace`'s arguments; without `outputs`, those of the session alone (no -o, -f)."""
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="probe specs, either form")
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "-c", "--command", metavar="CMD", help="run CMD with the probes armed; end with it"
    )
    target.add_argument(
        "-p",
        "--pid",
        type=int,
        action="append",
        default=[],
        metavar="PID",
        help="trace process PID, its threads and the children it creates (repeatable)",
    )
    parser.add_argument(
        "--children",
        action="store_true",
        help="with -p: also trace the processes PID already has (e.g. nginx's workers)",
    )
    parser.add_argument("-d", "--duration", type=float, metavar="SECONDS", help="stop after this")
    parser.add_argument("-n", "--count", type=int, metavar="COUNT", help="stop after COUNT events")
    if outputs:
        parser.add_argument("-o", "--output", metavar="FILE", help="write events to FILE")
        parser.add_argument(
            "-f", "--format", default="text", choices=output_formats(), help="event output format"
        )
    parser.add_argument("--engine", default="auto", choices=ENGINE_CHOICES)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the definitions that would be written"
    )
    parser.add_argument(
        "--clock",
        default="mono",
        help="trace clock (mono = CLOCK_MONOTONIC; the bpf engine reads mono or boot)",
    )
    parser.add_argument(
        "--buffer-size",
        type=int,
        metavar="KB",
        help="ring buffer size per CPU (the bpf engine's one ring: this times the CPUs)",
    )
    parser.add_argument(
        "--filter",
        metavar="EXPR",
        help="kernel filter for every tracepoint given without its own `if ...` "
        "(the bpf engine applies it to every uprobe too, in the program)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="allow function-tracer patterns that select every kernel function",
    )
    parser.add_argument(
        "--stack",
        action="store_true",
        help="record the kernel stack with every function-tracer event and the user stack "
        "with every uprobe event (tracefs engine)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")


def run(args: argparse.Namespace) -> int:
    kernel = RunningKernel.read()
    if args.dry_run:
        notes: list[str] = []
        for probe in resolve_specs(
            args.specs,
            pid=args.pid[0] if len(args.pid) == 1 else None,
            grammar=kernel.grammar,
            notes=notes,
        ):
            print(probe.spec.definition())
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        return 0
    session = Session(
        args.specs,
        engine=args.engine,
        pids=args.pid,
        existing_children=args.children,
        command=shlex.split(args.command) if args.command else None,
        options=engine_options(args),
        kernel=kernel,
    )
    if not args.quiet:
        for note in session.notes:
            print(f"note: {note}", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        binary = output_format(args.format).binary
        stream: IO[Any] = sys.stdout.buffer if binary else sys.stdout
        if args.output:
            stream = stack.enter_context(open(args.output, "wb" if binary else "w"))
        sink = open_sink(
            args.format, stream, context=session.kernel_context(), **sink_options(args, session)
        )
        summary = session.run([sink], duration=args.duration, count=args.count)
    if not args.quiet:
        print_summary(summary, sys.stderr)
    return summary.exit_status()


def sink_options(args: argparse.Namespace, session: Session) -> dict[str, Any]:
    """What the chosen output takes from the session beyond its KernelContext: a Perfetto
    trace, which entry probes a return probe ends (they become slices)."""
    if args.format != "perfetto":
        return {}
    from probescope.language.model import ProbeSpec
    from probescope.sinks.perfetto import entry_events_with_returns

    places = [
        (probe.spec.event_name, probe.kind, probe.path, probe.offset)
        for probe in session.probes
        if isinstance(probe.spec, ProbeSpec)
    ]
    return {"slices": entry_events_with_returns((), places)}


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine options `trace`'s own arguments ask for."""
    return EngineOptions(
        clock=args.clock,
        buffer_size_kb=args.buffer_size,
        default_filter=args.filter,
        allow_all_functions=args.all,
        function_stack=args.stack,
        user_stack=args.stack,
    )


def print_summary(summary: Summary, stream: IO[str]) -> None:
    from rich.console import Console  # only once the session is over: not on its start-up path
    from rich.table import Table

    console = Console(file=stream, soft_wrap=True, highlight=False)
    table = Table(box=None, pad_edge=False, show_header=True)
    hits_title = summary.stats.hits_title if summary.stats else None
    kernel_hits = summary.stats.hits if summary.stats and hits_title else {}
    misses = summary.stats.misses if summary.stats else {}
    table.add_column("event")
    table.add_column("hits", justify="right")
    if hits_title and kernel_hits:
        table.add_column(hits_title, justify="right")
    if misses:
        table.add_column("misses", justify="right")
    for name in sorted(set(summary.hits) | set(kernel_hits)):
        row = [name, str(summary.hits.get(name, 0))]
        if kernel_hits:
            row.append(str(kernel_hits.get(name, "")))
        if misses:
            row.append(str(misses.get(name, "")))
        table.add_row(*row)
    console.print(
        f"probescope: {summary.total} events in {summary.duration:.2f}s "
        f"({summary.engine} engine, {summary.reason}); lost {summary.lost}"
    )
    if summary.hits or kernel_hits:
        console.print(table)
    if len(summary.kinds) > 1:
        console.print(
            "by source: " + ", ".join(f"{kind} {n}" for kind, n in sorted(summary.kinds.items()))
        )
    if summary.stats:
        for note in summary.stats.notes:
            console.print(f"note: {note}")
    if summary.command_status is not None:
        console.print(f"command exited with status {summary.command_status}")
