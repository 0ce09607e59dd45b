"""Entry point of the `probescope` command: dispatches to one module per subcommand.

Only the module of the command being run is imported (with the engines, rich and the spec
model it needs): `probescope resolve` and `probescope symbols` must answer in the time it
takes to read a symbol table, not in the time it takes to import the tracing engines.

Whatever a user does ends in a sentence, never a traceback: bad input exits 2 (argparse's
usage errors too) and touches no kernel state, a machine that cannot do what is asked (no
tracefs for this user, no engine for these probes, the kernel or the traced process refusing)
exits 1, Ctrl-C 130, SIGTERM and SIGHUP 128+N, and a closed output (`| head`) ends the command
quietly with 141, as a Unix tool killed by SIGPIPE — teardown having run on every one of
these paths.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

from probescope import __version__
from probescope.errors import (
    BpfError,
    EngineUnavailable,
    ExecError,
    ProbescopeError,
    PtraceError,
    TracefsError,
)

# name -> (module under probescope.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("trace", "trace probes and print their events"),
    "record": ("record", "trace probes into a trace.dat file (trace-cmd's format)"),
    "report": ("report", "print a recording as text, JSON lines, Perfetto or Parquet"),
    "count": ("count", "count probe hits per key (funccount)"),
    "hist": ("hist", "histogram of an argument or return value per key (argdist)"),
    "latency": ("latency", "how long function calls take (funclatency)"),
    "stacks": ("stacks", "count the call stacks that reach probes; flame graphs"),
    "resolve": ("resolve", "print the kernel definitions probe specs resolve to"),
    "symbols": ("symbols", "list function symbols of a binary with their file offsets"),
    "list": ("list", "list tracepoints, kernel functions or USDT probes that can be traced"),
    "engines": ("engines", "say which engines can run here, and why not"),
    "cleanup": ("cleanup", "remove what dead probescope sessions left in tracefs"),
}
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 1
# What the kernel or a process refused once probescope acted on it: exit 1, not 2 — a 2 says
# the input was refused before anything was touched.
REFUSALS = (TracefsError, PtraceError, BpfError, ExecError)
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command`, only that subcommand's module is imported for its options
    (None: all of them, as `--help` of every subcommand needs)."""
    parser = argparse.ArgumentParser(
        prog="probescope",
        description="Linux dynamic and static tracing: uprobes, tracepoints and more.",
    )
    parser.add_argument("--version", action="version", version=f"probescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            module = importlib.import_module(f"probescope.cli.{module_name}")
            module.add_arguments(command_parser)
            command_parser.set_defaults(run=module.run)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names (its first word not starting with `-`), if it is one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    _pass_undecodable_bytes_through()
    try:
        with _signals_exit():
            status = _run(words)
            if status == EXIT_OUTPUT_CLOSED:
                _drop_output()
            else:
                sys.stdout.flush()
            return status
    except BrokenPipeError:
        _drop_output()
        return EXIT_OUTPUT_CLOSED
    except KeyboardInterrupt:  # before or after the command proper (imports, summary)
        return EXIT_INTERRUPTED


def _run(words: list[str]) -> int:
    for position, word in enumerate(words, 1):
        if "\0" in word:
            _say(
                f"error: argument {position} holds a NUL byte: {word!r}\n"
                "hint: no path, spec or option can contain one"
            )
            return EXIT_USAGE
    parser = build_parser(_command_in(words) or "")  # "": no command, so no options to parse
    try:
        args = parser.parse_args(words)
    except SystemExit as end:  # --help, --version, a usage error
        sys.stdout.flush()
        if end.code == 0:  # what --help printed must have got out (argparse hides a failure)
            from probescope.sinks.base import StreamWatch

            StreamWatch(sys.stdout).check()
        raise
    try:
        return int(args.run(args))
    except (EngineUnavailable, *REFUSALS) as error:
        _say(error.render())
        return EXIT_UNAVAILABLE
    except ProbescopeError as error:
        _say(error.render())
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # a closed output: main() ends quietly with 141
    except OSError as error:  # the system refused a read or write (e.g. -o /proc/version)
        where = f": {error.filename}" if error.filename else ""
        _say(f"error: the system refused a read or write{where}: {error.strerror or error}")
        return EXIT_UNAVAILABLE


def _say(text: str) -> None:
    """A line on stderr, unless stderr is a closed pipe too."""
    with contextlib.suppress(BrokenPipeError):
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP end the command like Ctrl-C does, through every `finally` (a
    session's teardown runs), with the status a shell shows for that signal. A running
    session turns them into its own clean end meanwhile."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _pass_undecodable_bytes_through() -> None:
    """Paths that are not UTF-8 come in as surrogate escapes (PEP 383): print them back as the
    bytes they were instead of failing on them."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]


def _drop_output() -> None:
    """The reader of stdout went away: whatever is still buffered goes nowhere, and the
    interpreter's last flush must not complain about it."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
