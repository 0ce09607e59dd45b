"""`probescope report FILE`: a recording (probescope's or trace-cmd's trace.dat) printed as the
live session would have printed it — text, JSON lines — or turned into a Perfetto trace or a
Parquet table. Reads nothing of the machine it runs on."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import IO, Any

from probescope.language.model import ProbeKind
from probescope.record.recording import Recording
from probescope.sinks.base import open_sink, output_format, output_formats
from probescope.sinks.text import TextSink
from probescope.sinks.text_program import write_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a trace.dat (probescope or trace-cmd)")
    parser.add_argument(
        "-f", "--format", default="text", choices=output_formats(), help="output format"
    )
    parser.add_argument("-o", "--output", metavar="OUT", help="write to OUT (default stdout)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")


def run(args: argparse.Namespace) -> int:
    chosen = output_format(args.format)
    with Recording.from_path(args.file) as recording, contextlib.ExitStack() as stack:
        stream: IO[Any] = sys.stdout.buffer
        if args.output:
            stream = stack.enter_context(open(args.output, "wb"))
        elif chosen.binary and sys.stdout.isatty():
            print(f"error: {args.format} output is binary: give -o OUT", file=sys.stderr)
            return 2
        sink = open_sink(
            args.format, stream, context=recording.context, **sink_options(args.format, recording)
        )
        events = lost = 0
        try:
            if isinstance(sink, TextSink):  # through the compiled loop where it is built
                events, lost = write_text(recording, sink)
            else:
                for batch in recording.batches():
                    if batch.events or batch.lost:
                        sink.write_batch(batch)
                        events += len(batch.events)
                        lost += max(batch.lost, 0)
        except BrokenPipeError:  # `probescope report FILE | head`: the reader had enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE  # as every command (cli/main.py), as a Unix tool
        finally:
            with contextlib.suppress(BrokenPipeError):
                sink.close()
        if not args.quiet:
            print_report_summary(recording, events, lost, sys.stderr)
            unmatched = getattr(sink, "unmatched_returns", 0)
            if unmatched:
                print(f"note: {unmatched} returns with no entry event dropped", file=sys.stderr)
    return 0


def sink_options(name: str, recording: Recording) -> dict[str, Any]:
    """What a format's sink takes from a recording beyond its KernelContext."""
    if name == "text":
        return {"clock": recording.clock}
    if name == "perfetto":
        from probescope.record.symbolizer import RecordedSymbols
        from probescope.sinks.perfetto import entry_events_with_returns

        facts = recording.facts
        probes = [
            (p["event"], ProbeKind(p["kind"]), p.get("path"), p.get("offset"))
            for p in facts.probes
            if p.get("event")
        ]
        types = recording.known_event_types()
        return {
            "slices": entry_events_with_returns(types, probes) if types else None,
            "symbolize": RecordedSymbols(facts) if facts.files else None,
        }
    if name == "parquet":
        return {"host": recording.host}
    return {}


def print_report_summary(recording: Recording, events: int, lost: int, stream: IO[str]) -> None:
    writer = recording.facts.engine or "trace-cmd"
    print(
        f"probescope: {events} events from {recording.dat.stream.name} "
        f"(written by {writer}, trace.dat v{recording.dat.version}); lost {lost}",
        file=stream,
    )
    skipped = sum(recording.skipped.values())
    if skipped:
        print(
            f"note: {skipped} records of events the file has no readable format for were left out",
            file=stream,
        )
    for name, why in sorted(recording.refused.items()):
        if any(recording.skipped):
            print(f"note: format {name} not read: {why}", file=stream)
