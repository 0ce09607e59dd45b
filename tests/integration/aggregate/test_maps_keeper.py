"""The helper that copies a command's memory maps at its exec and exit never holds the
command back: an aborted start (the engine failed to attach) still ends the command."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from probescope.aggregate.maps_keeper import MapsKeeper
from probescope.engines.launch import GatedCommand

pytestmark = pytest.mark.root


def test_an_aborted_command_is_not_kept_waiting_by_the_helper() -> None:
    gate = GatedCommand(["true"])
    pid = gate.start()
    keeper = MapsKeeper(lambda pid, text: None)
    assert keeper.start(pid)
    aborted = threading.Event()
    worker = threading.Thread(target=lambda: (gate.abort(), aborted.set()), daemon=True)
    try:
        worker.start()
        assert aborted.wait(10), "the command still waits at its gate"
    finally:
        keeper.stop()
        if not aborted.is_set():
            os.kill(pid, signal.SIGKILL)
        worker.join(5)
    assert gate.returncode is not None
