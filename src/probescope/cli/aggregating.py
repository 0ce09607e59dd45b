"""What `count`, `hist`, `latency` and `stacks` share: their options (those of `trace` plus
`--by`, `-i`, `--top`, `-f`, `-o`, `--input`), the run with interval printing, and the summary.

With `--input FILE` the values are those of a recording's events (`record.recording_aggregation`),
`-i` cuts them into intervals of recorded time (each stamped with the trace clock's time it
starts at, as `report` prints times), and the options that choose or steer a live session are
refused."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from probescope.aggregate.keys import parse_key_fields
from probescope.aggregate.maps import Aggregation
from probescope.aggregate.plan import AggregationError
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
from probescope.record.recording import Recording
from probescope.record.recording_aggregation import RecordingAggregation


def add_aggregation_arguments(parser: argparse.ArgumentParser, *, default_by: str) -> None:
    add_session_arguments(parser, specs_optional=True)
    parser.add_argument(
        "--input",
        metavar="FILE",
        help="aggregate the events of a recording (probescope record, trace-cmd record) "
        "instead of a live session; SPECs then name recorded events",
    )
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
        help="print the values every SECONDS and clear them (with --input: every SECONDS of "
        "recorded time)",
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
    run: AggregationRun | RecordedRun
    if args.input is not None:
        refuse_live_options(args)
        run = RecordedRun(request, args.input)
    elif not args.specs:
        raise AggregationError(
            "no probes to aggregate",
            hint="give at least one probe spec, or --input FILE to aggregate a recording",
        )
    else:
        run = AggregationRun(
            request,
            engine=args.engine,
            pids=args.pid,
            existing_children=args.children,
            command=command_argv(args.command),
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
                now = run.stamp(values) if isinstance(run, RecordedRun) else _wall_clock()
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


class RecordedRun:
    """A recording's aggregation with AggregationRun's face (`run`, `summary`), so it prints
    as a live one does. Every check is made when it is created, before -o is opened."""

    def __init__(self, request: Request, path: str) -> None:
        self.path = path
        self.recording = Recording.from_path(path)
        try:
            self.aggregation = RecordingAggregation(request, self.recording)
        except BaseException:
            self.recording.close()
            raise
        self.took = 0.0

    def run(
        self,
        *,
        interval: float | None = None,
        on_interval: Callable[[Aggregation], None] | None = None,
        **live: Any,
    ) -> Aggregation:
        """The values of every selected event, per `interval` of recorded time if given
        (`live`: AggregationRun.run()'s other keywords, which `refuse_live_options` left
        unset)."""
        started = time.monotonic()
        try:
            return self.aggregation.run(interval=interval, on_interval=on_interval)
        finally:
            self.took = time.monotonic() - started
            self.recording.close()

    @staticmethod
    def stamp(values: Aggregation) -> str:
        """An interval's stamp: the recorded time it starts at, in seconds as `report`
        prints event times."""
        seconds, nanoseconds = divmod(values.started_ns, 1_000_000_000)
        return f"{seconds}.{nanoseconds // 1000:06d}"

    def summary(self) -> RunSummary:
        writer = self.recording.facts.engine or "trace-cmd"
        return RunSummary(
            engine=writer,
            duration=self.took,
            events=self.aggregation.events,
            lost=self.aggregation.lost,
            reason=f"recording {self.path}",
            fast_path=False,
            in_kernel=False,
            notes=[],
            command_status=None,
        )


# option -> (how the user spells it, whether it was given)
_LIVE_ONLY: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "command": ("-c", lambda v: v is not None),
    "pid": ("-p", bool),
    "children": ("--children", bool),
    "engine": ("--engine", lambda v: v != "auto"),
    "duration": ("-d", lambda v: v is not None),
    "clock": ("--clock", lambda v: v != "mono"),
    "buffer_size": ("--buffer-size", lambda v: v is not None),
    "filter": ("--filter", lambda v: v is not None),
    "all": ("--all", bool),
}


def refuse_live_options(args: argparse.Namespace) -> None:
    """With --input, the options of a live session (its target, engine, clock, buffers,
    filter, duration) are errors: the recording's session made those choices. (-i is not:
    it cuts the recording's own time.)"""
    given = [flag for name, (flag, used) in _LIVE_ONLY.items() if used(getattr(args, name))]
    if given:
        they = "it steers" if len(given) == 1 else "they steer"
        raise AggregationError(
            f"{', '.join(given)} cannot be used with --input: {they} a live session, "
            "and a recording's session is over",
            hint="give them to `probescope record` (e.g. probescope record SPEC... -c CMD "
            "-o FILE), or aggregate live without --input",
        )


def _wall_clock() -> str:
    return time.strftime("%H:%M:%S")


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
