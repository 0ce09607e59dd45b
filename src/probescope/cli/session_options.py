"""The options every command that runs a session takes (trace, count, hist, latency, stacks):
specs, what to trace, how long, which engine and its settings. Kept apart from `trace` so the
aggregation commands share them without importing what only `trace` prints with."""

from __future__ import annotations

import argparse

from probescope.engines.base import EngineOptions
from probescope.engines.registry import ENGINE_CHOICES


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--engine", default="auto", choices=ENGINE_CHOICES)
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
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine options the session arguments ask for (`--stack` only where a command has
    it: `trace --stack` records kernel stacks of function-tracer events and user stacks of
    uprobe events)."""
    stack = getattr(args, "stack", False)
    return EngineOptions(
        clock=args.clock,
        buffer_size_kb=args.buffer_size,
        default_filter=args.filter,
        allow_all_functions=args.all,
        function_stack=stack,
        user_stack=stack,
    )
