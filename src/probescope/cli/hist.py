"""`probescope hist SPEC... --of ARG [--linear MIN,MAX,STEP] [--by KEY]`: the distribution
of an argument or return value in power-of-two or linear buckets (argdist, bpftrace's `hist()`
and `lhist()`)."""

from __future__ import annotations

import argparse

from probescope.aggregate.values import LinearScale, Scale
from probescope.aggregations import Request
from probescope.cli.aggregating import add_aggregation_arguments, key_fields, run_aggregation
from probescope.errors import SpecError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_aggregation_arguments(parser, default_by="probe when there are several, else none")
    parser.add_argument(
        "--of",
        required=True,
        metavar="ARG",
        help="the argument to count values of: a name the spec gives, argN at a function "
        "entry, or retval on a return probe",
    )
    parser.add_argument(
        "--linear",
        metavar="MIN,MAX,STEP",
        help="linear buckets of STEP from MIN to MAX instead of powers of two",
    )


def parse_linear(text: str) -> Scale:
    """`0,100,10` → LinearScale(0, 100, 10); errors point at the offending number."""
    words = text.split(",")
    if len(words) != 3:
        raise SpecError(
            "--linear takes three numbers", spec=text, column=0, hint="e.g. --linear 0,1000,100"
        )
    numbers = []
    column = 0
    for word in words:
        try:
            numbers.append(int(word, 0))
        except ValueError:
            raise SpecError(
                f"{word.strip()!r} is not an integer", spec=text, column=column
            ) from None
        column += len(word) + 1
    return LinearScale(*numbers)


def run(args: argparse.Namespace) -> int:
    scale = parse_linear(args.linear) if args.linear else None
    fields = key_fields(args)
    return run_aggregation(
        args, Request("hist", tuple(args.specs), fields, of=args.of, scale=scale)
    )
