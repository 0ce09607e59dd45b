"""Entry point of the `probescope` command: dispatches to one module per subcommand.

Only the module of the command being run is imported (with the engines, rich and the spec
model it needs): `probescope resolve` and `probescope symbols` must answer in the time it
takes to read a symbol table, not in the time it takes to import the tracing engines.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from probescope import __version__
from probescope.errors import ProbescopeError

# name -> (module under probescope.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("trace", "trace probes and print their events"),
    "record": ("record", "trace probes into a trace.dat file (trace-cmd's format)"),
    "report": ("report", "print a recording as text, JSON lines, Perfetto or Parquet"),
    "resolve": ("resolve", "print the kernel definitions probe specs resolve to"),
    "symbols": ("symbols", "list function symbols of a binary with their file offsets"),
    "list": ("list", "list tracepoints, kernel functions or USDT probes that can be traced"),
    "engines": ("engines", "say which engines can run here, and why not"),
    "cleanup": ("cleanup", "remove what dead probescope sessions left in tracefs"),
}


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
    parser = build_parser(_command_in(words) or "")  # "": no command, so no options to parse
    args = parser.parse_args(words)
    try:
        return int(args.run(args))
    except ProbescopeError as error:
        print(error.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
