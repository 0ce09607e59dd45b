"""`probescope engines`: which engines can run here, and why the others cannot."""

from __future__ import annotations

import argparse

from rich.table import Table

from probescope.cli._console import console
from probescope.engines.registry import ENGINES, availability


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    table = Table(box=None, pad_edge=False)
    table.add_column("engine")
    table.add_column("available")
    table.add_column("what it is / why not")
    usable = 0
    for entry in ENGINES:
        state = availability(entry)
        usable += state.ok
        reason = entry.summary if state.ok else state.reason
        if not state.ok and state.hint:
            reason += f" — {state.hint}"
        table.add_row(entry.name, "yes" if state.ok else "no", reason)
    console(soft_wrap=True).print(table)
    return 0 if usable else 1
