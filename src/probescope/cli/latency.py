"""`probescope latency FUNC-SPEC... [--by KEY] [--unit ns|us|ms]`: how long calls take
(funclatency). Entry and return probes are made for each function and paired per thread,
recursion included; calls abandoned by longjmp or exceptions are dropped and counted.
`-o FILE.speedscope.json` also writes every call as an evented profile."""

from __future__ import annotations

import argparse

from probescope.aggregate.render import stack_format_of
from probescope.aggregate.values import UNITS
from probescope.aggregations import Request
from probescope.cli.aggregating import (
    add_aggregation_arguments,
    add_stack_arguments,
    key_fields,
    run_aggregation,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_aggregation_arguments(parser, default_by="probe when there are several, else none")
    parser.add_argument("--unit", default="us", choices=tuple(UNITS), help="histogram unit")
    add_stack_arguments(parser)


def run(args: argparse.Namespace) -> int:
    keep_spans = bool(args.output) and stack_format_of(args.output) == "speedscope"
    request = Request(
        "latency",
        tuple(args.specs),
        key_fields(args),
        unit=args.unit,
        keep_spans=keep_spans,
        stack_method=args.stack_method,
        stack_size=args.stack_size,
    )
    return run_aggregation(args, request)
