"""Entry point of the `probescope` command: dispatches to one module per subcommand."""

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
    "resolve": ("resolve", "print the kernel definitions probe specs resolve to"),
    "symbols": ("symbols", "list function symbols of a binary with their file offsets"),
    "list": ("list", "list tracepoints, kernel functions or USDT probes that can be traced"),
    "engines": ("engines", "say which engines can run here, and why not"),
    "cleanup": ("cleanup", "remove what dead probescope sessions left in tracefs"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="probescope",
        description="Linux dynamic and static tracing: uprobes, tracepoints and more.",
    )
    parser.add_argument("--version", action="version", version=f"probescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(f"probescope.cli.{module_name}")
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ProbescopeError as error:
        print(error.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
