"""Owner-named kernel objects: names round-trip and liveness follows pid + start time."""

import os
import subprocess

from probescope.engines.tracefs.ownership import Owner, process_start_time


def test_current_owner_is_alive_and_names_round_trip() -> None:
    owner = Owner.current()
    assert owner.pid == os.getpid()
    assert owner.alive()
    assert Owner.of(owner.group_name()) == owner
    assert Owner.of(owner.group_name(3)) == owner
    assert Owner.of(owner.instance_name(2)) == owner
    assert len(owner.group_name(99)) <= 63


def test_dead_process_and_reused_pid_are_not_alive() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not Owner(child.pid, 12345).alive()
    me = process_start_time(os.getpid())
    assert me is not None
    assert not Owner(os.getpid(), me + 1).alive()


def test_foreign_names_have_no_owner() -> None:
    assert Owner.of("uprobes") is None
    assert Owner.of("probescope") is None
    assert Owner.of("probescope_capture") is None
