"""Helpers for the bpf engine's tests: whether BPF can be used here, sessions on a named
engine, and what a traced process's text looks like against its file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from probescope.engines.bpf.engine import BpfEngine
from probescope.events import Event
from probescope.session import Session, Summary

TARGETS = Path(__file__).resolve().parents[2] / "targets" / "bpf"


def bpf_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the bpf tests run as root (tracefs is their oracle)"
    state = BpfEngine().available()
    return None if state.ok else state.reason


def trace(
    engine: str, specs: Sequence[str], argv: Sequence[str], **session: object
) -> tuple[list[Event], Summary]:
    """Run `argv` under `specs` on `engine` to its end: its events and the summary."""
    run = Session(list(specs), engine=engine, command=list(argv), **session)  # type: ignore[arg-type]
    with run:
        events = list(run.events(duration=120))
    return events, run.summary()


def args_by_event(events: Sequence[Event]) -> dict[str, list[tuple[object, ...]]]:
    found: dict[str, list[tuple[object, ...]]] = {}
    for event in events:
        found.setdefault(event.name, []).append(tuple(event.args))
    return found
