"""Issue 16's namespace case in the cross-engine suite: a program running in another mount
namespace (its binary on a tmpfs only that namespace sees) traced by its path with `-p PID`,
on every engine that runs here — the same calls, at the same address, with the same
arguments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.cross_engine.test_engines_agree import engines
from probescope.engines.fentry.engine import FentryEngine
from probescope.session import Session
from support.namespaces import namespaced_ticker

pytestmark = pytest.mark.root

EVENTS = 5


@pytest.fixture
def namespaced(tmp_path: Path) -> Iterator[tuple[int, str]]:
    with namespaced_ticker(tmp_path) as running:
        yield running


def test_every_engine_traces_a_program_in_another_mount_namespace_by_its_path(
    namespaced: tuple[int, str],
) -> None:
    pid, path = namespaced
    specs = [f"{path}:tick i=arg1:s64"]
    seen: dict[str, list[tuple[str, int, int]]] = {}
    fentry = FentryEngine()
    takes_all = fentry.available().ok and not fentry.refusals(Session(specs, pids=[pid]).probes)
    for engine in (*engines(), *(["fentry"] if takes_all else [])):
        session = Session(specs, engine=engine, pids=[pid])
        with session:
            events = list(session.events(duration=20, count=EVENTS))
        assert len(events) == EVENTS, engine
        assert all(e.pid == pid for e in events), engine
        first = events[0].args[0]
        # consecutive calls of one running program: tick(i), tick(i+1), ...
        assert [e.args[0] for e in events] == list(range(first, first + EVENTS)), engine
        seen[engine] = [(e.name, e.ip, e.args[0] - first) for e in events]
    assert len(seen) >= 2
    reference = seen["tracefs"]
    for engine, shape in seen.items():
        assert shape == reference, f"{engine} differs from tracefs"
