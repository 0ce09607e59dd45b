"""`probescope stacks SPEC... [-o FILE.svg|.folded|.speedscope.json]`: which call paths lead
to the probes, counted (stackcount), and flame graphs of them."""

from __future__ import annotations

import argparse

from probescope.aggregations import Request
from probescope.cli.aggregating import (
    add_aggregation_arguments,
    add_stack_arguments,
    key_fields,
    run_aggregation,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_aggregation_arguments(
        parser, default_by="ustack for user probes, kstack for kernel ones (and probe)"
    )
    add_stack_arguments(parser)


def run(args: argparse.Namespace) -> int:
    request = Request(
        "stacks",
        tuple(args.specs),
        key_fields(args),
        stack_method=args.stack_method,
        stack_size=args.stack_size,
    )
    return run_aggregation(args, request)
