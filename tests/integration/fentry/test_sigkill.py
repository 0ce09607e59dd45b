"""probescope SIGKILLed at random moments — before, during and after it patches — never harms
the traced program: its output and exit status are intact, the ring just fills; the next run
or `probescope cleanup -p PID` puts every byte back."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest

from support.processes import text_differences

from .harness import (
    hammer,
    hammer_specs,
    libc_path,
    our_areas,
    requires_fentry,
    start,
)

pytestmark = [pytest.mark.root, pytest.mark.slow, requires_fentry]


def trace(pid: int, specs: list[str], duration: float | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "probescope", "trace", "--engine", "fentry", "-q", "-p", str(pid)]
    if duration is not None:
        argv += ["-d", str(duration)]
    return subprocess.Popen(
        [*argv, "-o", "/dev/null", *specs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cleanup(pid: int) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "probescope", "cleanup", "-p", str(pid)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sigkill_at_random_moments_never_harms_the_program() -> None:
    path = hammer()
    specs = hammer_specs(path)
    chance = random.Random(15)
    program = start([path, "stdin"])  # runs until we close its stdin, then checks its sums
    try:
        for trial in range(10):
            tracer = trace(program.pid, specs)
            time.sleep(chance.uniform(0.0, 1.2))
            tracer.kill()
            tracer.wait()
            time.sleep(0.05)
            assert program.poll() is None, f"trial {trial}: the program died"
            if trial % 2:
                cleanup(program.pid)
            else:  # the next run restores what the killed one left, then detaches cleanly
                follow = trace(program.pid, specs, duration=0.3)
                _, err = follow.communicate(timeout=60)
                assert follow.returncode == 0, err
            assert text_differences(program.pid, path) == [], f"trial {trial}"
            assert text_differences(program.pid, libc_path(program.pid)) == [], f"trial {trial}"
            assert our_areas(program.pid) == [], f"trial {trial}"
    except BaseException:
        program.kill()
        raise
    out, _ = program.communicate(timeout=60)
    assert (out, program.returncode) == ("good 4\n", 0)


def test_a_killed_tracer_leaves_the_program_running_to_its_normal_end() -> None:
    path = hammer()
    program = start([path, "3"])
    tracer = trace(program.pid, hammer_specs(path))
    time.sleep(1.5)
    tracer.kill()
    tracer.wait()
    out, _ = program.communicate(timeout=60)
    assert (out, program.returncode) == ("good 4\n", 0)
