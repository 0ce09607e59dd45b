"""`probescope trace SPEC...`: install probes, stream their events to a sink, report, and
leave nothing behind — on a normal end, Ctrl-C, SIGTERM/SIGHUP, or an error in the sink."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import IO, Any

from probescope.cli.session_options import (
    add_session_arguments,
    command_argv,
    engine_options,
    open_output,
    positive,
)
from probescope.session import Session, Summary
from probescope.sinks.base import open_sink, output_format, output_formats
from probescope.symbols.resolve import resolve_specs
from probescope.system.kernel import RunningKernel


def add_arguments(parser: argparse.ArgumentParser, *, outputs: bool = True) -> None:
    """`trace`'s arguments; without `outputs`, those of the session alone (no -o, -f)."""
    add_session_arguments(parser)
    parser.add_argument(
        "-n", "--count", type=positive, metavar="COUNT", help="stop after COUNT events"
    )
    if outputs:
        parser.add_argument("-o", "--output", metavar="FILE", help="write events to FILE")
        parser.add_argument(
            "-f", "--format", default="text", choices=output_formats(), help="event output format"
        )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the definitions that would be written"
    )
    parser.add_argument(
        "--stack",
        action="store_true",
        help="record the kernel stack with every function-tracer event and the user stack "
        "with every uprobe event (tracefs engine)",
    )


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
        command=command_argv(args.command),
        options=engine_options(args),
        kernel=kernel,
    )
    if not args.quiet:
        for note in session.notes:
            print(f"note: {note}", file=sys.stderr)
    session.prepare()
    said = list(session.engine_notes)
    if not args.quiet:
        for note in said:  # why `auto` passed engines over, before the first event
            print(f"note: {note}", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        binary = output_format(args.format).binary
        stream: IO[Any] = sys.stdout.buffer if binary else sys.stdout
        if args.output:
            stream = stack.enter_context(open_output(args.output, binary=binary))
        sink = open_sink(
            args.format, stream, context=session.kernel_context(), **sink_options(args, session)
        )
        summary = session.run([sink], duration=args.duration, count=args.count)
    if not args.quiet:
        print_summary(summary, sys.stderr, said=said)
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


def print_summary(summary: Summary, stream: IO[str], *, said: Sequence[str] = ()) -> None:
    """The report on stderr: events shown, and where the engine counted more hits than were
    shown, where each went (after the stop, or not recorded: other processes, filters, loss);
    notes not already printed (`said`)."""
    from rich.table import Table  # only once the session is over: not on its start-up path

    from probescope.cli._console import console as make_console

    console = make_console(stream, soft_wrap=True, highlight=False)
    table = Table(box=None, pad_edge=False, show_header=True)
    hits_title = summary.stats.hits_title if summary.stats else None
    kernel_hits = summary.stats.hits if summary.stats and hits_title else {}
    misses = summary.stats.misses if summary.stats else {}
    names = sorted(set(summary.hits) | set(kernel_hits))
    after_stop = any(summary.after_stop.get(name) for name in names)
    unrecorded = any(summary.unrecorded(name) for name in names)
    table.add_column("event")
    table.add_column("hits", justify="right")
    if hits_title and kernel_hits:
        table.add_column(hits_title, justify="right")
    if after_stop:
        table.add_column("after the stop", justify="right")
    if unrecorded:
        table.add_column("not recorded", justify="right")
    if misses:
        table.add_column("misses", justify="right")
    for name in names:
        row = [name, str(summary.hits.get(name, 0))]
        if kernel_hits:
            row.append(str(kernel_hits.get(name, "")))
        if after_stop:
            row.append(str(summary.after_stop.get(name, 0)))
        if unrecorded:
            row.append(str(summary.unrecorded(name)))
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
    if unrecorded:
        console.print(
            "note: not recorded: hits the kernel counted in other processes, filtered out or lost"
        )
    if summary.stats:
        for note in summary.stats.notes:
            if note not in said:
                console.print(f"note: {note}")
    if summary.command_status is not None:
        console.print(f"command exited with status {summary.command_status}")
