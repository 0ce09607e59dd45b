"""What `count`, `hist`, `latency` and `stacks` share: their options (those of `trace` plus
`--by`, `-i`, `--top`, `-f`, `-o`), the run with interval printing, and the summary."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import IO

from probescope.aggregate.keys import parse_key_fields
from probescope.aggregate.maps import Aggregation
from probescope.aggregate.render import render_stacks, stack_format_of
from probescope.aggregate.render.json_records import render_json
from probescope.aggregate.render.text import render_text
from probescope.aggregate.stack_capture import MAX_SNAPSHOT, METHODS
from probescope.aggregations import AggregationRun, Request, RunSummary
from probescope.cli.session_options import (
    add_session_arguments,
    command_argv,
    engine_options,
    open_output,
    positive,
    seconds,
)


def add_aggregation_arguments(parser: argparse.ArgumentParser, *, default_by: str) -> None:
    add_session_arguments(parser)
    parser.add_argument(
        "--by",
        metavar="KEY,...",
        help="key the values by: probe, comm, pid, tid, cpu, an argument name (argN at a "
        f"function entry), retval, ustack, kstack (default: {default_by})",
    )
    parser.add_argument(
        "-i",
        "--interval",
        type=seconds,
        metavar="SECONDS",
        help="print the values every SECONDS and clear them",
    )
    parser.add_argument("--top", type=positive, metavar="N", help="print only the N largest keys")
    parser.add_argument(
        "-f", "--format", default="text", choices=("text", "json"), help="output format"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write the values to FILE")


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stack-method",
        default="dwarf",
        choices=METHODS,
        help="user stacks by DWARF CFI from a copy of the stack (default; works without frame "
        "pointers) or by frame pointers",
    )
    parser.add_argument(
        "--stack-size",
        type=positive,
        default=MAX_SNAPSHOT,
        metavar="BYTES",
        help=f"bytes of stack copied per hit for dwarf unwinding (at most {MAX_SNAPSHOT})",
    )


def key_fields(args: argparse.Namespace) -> tuple[str, ...] | None:
    return parse_key_fields(args.by) if args.by is not None else None


def run_aggregation(args: argparse.Namespace, request: Request) -> int:
    """Run `request` with the session options of `args`, print the values, return the exit
    status (the command's own when it ran to its end, like `trace`)."""
    command = command_argv(args.command)
    run = AggregationRun(
        request,
        engine=args.engine,
        pids=args.pid,
        existing_children=args.children,
        command=command,
        options=engine_options(args),
        interval=args.interval,
    )
    output = getattr(args, "output", None)
    stack_format = stack_format_of(output) if output else None
    with contextlib.ExitStack() as files:
        stream: IO[str] = sys.stdout
        target: IO[str] | None = None
        if output and stack_format is None:
            stream = files.enter_context(open_output(output))
        elif output:
            target = files.enter_context(open_output(output))

        def show(values: Aggregation, *, stamp: bool) -> None:
            if stamp:
                now = time.strftime("%H:%M:%S")
                if args.format == "json":
                    stream.write(f'{{"type": "time", "data": "{now}\\n"}}\n')
                else:
                    stream.write(f"{now}\n")
            if args.format == "json":
                render_json(values, stream, top=args.top)
            else:
                render_text(values, stream, top=args.top)
            stream.flush()

        interval = args.interval
        values = run.run(
            duration=args.duration,
            interval=interval,
            on_interval=(lambda v: show(v, stamp=True)) if interval else None,
        )
        # A stacks file replaces the text of `stacks` (thousands of stacks), not of `latency`.
        if stack_format is None or request.kind != "stacks":
            with contextlib.suppress(BrokenPipeError):
                show(values, stamp=bool(interval))
        if stack_format is not None and target is not None:
            render_stacks(values, target, stack_format, title=_title(args))
    summary = run.summary()
    if not args.quiet:
        print_summary(summary, values, sys.stderr, output if stack_format else None)
    if summary.reason == "end" and summary.command_status is not None:
        status = summary.command_status
        return status if status >= 0 else 128 - status
    return 0


def _title(args: argparse.Namespace) -> str:
    return " ".join(args.specs)


def print_summary(
    summary: RunSummary, values: Aggregation, stream: IO[str], written: str | None
) -> None:
    path = " (records aggregated in place)" if summary.fast_path else ""
    if summary.in_kernel:
        path = " (aggregated in the kernel)"
    stream.write(
        f"probescope: {summary.events} events aggregated in {summary.duration:.2f}s "
        f"({summary.engine} engine{path}, {summary.reason}); lost {summary.lost}\n"
    )
    for counter, amount in sorted(values.counters.items()):
        stream.write(f"{counter}: {amount}\n")
    for note in summary.notes:
        stream.write(f"note: {note}\n")
    if written:
        stream.write(f"wrote {written}\n")
    if summary.command_status is not None:
        stream.write(f"command exited with status {summary.command_status}\n")
