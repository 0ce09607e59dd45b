"""`probescope count SPEC... [--by KEY,...] [--top N] [-i SECONDS]`: how often each probe
fires, per key (funccount, bpftrace's `@[...] = count()`)."""

from __future__ import annotations

import argparse

from probescope.aggregations import Request
from probescope.cli.aggregating import add_aggregation_arguments, key_fields, run_aggregation


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_aggregation_arguments(parser, default_by="probe")


def run(args: argparse.Namespace) -> int:
    return run_aggregation(args, Request("count", tuple(args.specs), key_fields(args)))
