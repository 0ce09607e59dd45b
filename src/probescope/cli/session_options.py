"""The options every command that runs a session takes (trace, count, hist, latency, stacks):
specs, what to trace, how long, which engine and its settings. Kept apart from `trace` so the
aggregation commands share them without importing what only `trace` prints with."""

from __future__ import annotations

import argparse
import errno
import math
import os
import shlex
from typing import IO, Any

from probescope.engines.base import EngineOptions
from probescope.engines.registry import ENGINE_CHOICES
from probescope.errors import ProbescopeError


def add_session_arguments(parser: argparse.ArgumentParser, *, specs_optional: bool = False) -> None:
    """`specs_optional`: the command checks itself that SPECs are given when it needs them
    (the aggregation commands do not with --input)."""
    parser.add_argument(
        "specs",
        nargs="*" if specs_optional else "+",
        metavar="SPEC",
        help="probe specs, either form"
        + ("; with --input, recorded events' names (none: all)" if specs_optional else ""),
    )
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
    parser.add_argument("-d", "--duration", type=seconds, metavar="SECONDS", help="stop after this")
    parser.add_argument("--engine", default="auto", choices=ENGINE_CHOICES)
    parser.add_argument(
        "--clock",
        default="mono",
        help="trace clock (mono = CLOCK_MONOTONIC; the bpf engine reads mono or boot)",
    )
    parser.add_argument(
        "--buffer-size",
        type=positive,
        metavar="KB",
        help="ring buffer size per CPU (the bpf engine's one ring: this times the CPUs)",
    )
    parser.add_argument(
        "--filter",
        metavar="EXPR",
        help="filter for every probe given without its own `if ...` (the kernel's event "
        "filter grammar: tracefs writes it to the event, bpf compiles it, ptrace evaluates it)",
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


def seconds(text: str) -> float:
    """-d: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def positive(text: str) -> int:
    """-n, --buffer-size, -i: a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text!r}")
    return value


def command_argv(text: str | None) -> list[str] | None:
    """`-c CMD` split as a shell would split it (without running a shell)."""
    if text is None:
        return None
    try:
        argv = shlex.split(text)
    except ValueError as error:
        raise ProbescopeError(
            f"cannot split the command {text!r}: {error}",
            hint="quote it as a shell would: -c 'prog \"an argument\"'",
        ) from None
    if not argv:
        raise ProbescopeError("the command (-c) is empty", hint="e.g. -c './prog arg'")
    return argv


def check_output_path(path: str) -> None:
    """A file written at the end (a recording) checked before anything is attached: its
    directory exists and takes new files, and the path is not a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ProbescopeError(f"cannot write the output file {path!r}: it is a directory")
    if not os.path.isdir(directory):
        raise ProbescopeError(
            f"cannot write the output file {path!r}: No such file or directory",
            hint="its directory does not exist: create it first",
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ProbescopeError(
            f"cannot write the output file {path!r}: {os.strerror(errno.EACCES)}",
            hint=f"choose a directory you may write to (not {directory})",
        )


def open_output(path: str, *, binary: bool = False) -> IO[Any]:
    """`-o FILE`, opened before anything is attached; a clear error when it cannot be."""
    try:
        if binary:
            return open(path, "wb")
        return open(path, "w", errors="surrogateescape")
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        hint = None
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            hint = "its directory does not exist: create it first"
        raise ProbescopeError(
            f"cannot write the output file {path!r}: {reason}", hint=hint
        ) from None
