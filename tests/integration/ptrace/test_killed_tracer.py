"""probescope SIGKILLed while it traces: the traced program never notices.

50 runs of `probescope trace --engine ptrace -p PID` on a running program whose four threads
call entry- and return-probed functions in a hot loop, each run killing probescope with
SIGKILL at a random moment — while it starts and attaches, or while it streams. The program
(built -O0, where the functions start with a one-byte `push`, and -O2, where they start with
longer instructions and a call) must then finish with its normal output and exit status, be
traced by nobody, and have text equal to the file's bytes (issue 11, item 3)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.processes import proc_status, readline_within, text_differences, tracer_of

pytestmark = pytest.mark.slow

RUNS = 50
EARLY = 10  # runs killed before the first event (start-up, resolution, attach)
LATEST_KILL = 0.4  # seconds after the first event


@dataclass
class Tally:
    runs: int = 0
    early: int = 0
    streaming: int = 0
    survived: int = 0
    restored: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"SIGKILL tally: {self.runs} runs ({self.early} during start-up/attach, "
            f"{self.streaming} while streaming); program output and status unchanged "
            f"{self.survived}, text equal to the file {self.restored}"
        )


def _one_run(
    path: Path, early: bool, blocked: bool, startup: list[float], tally: Tally, rng: random.Random
):
    program = subprocess.Popen(
        [str(path), "4", *(["blocked"] if blocked else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    tracer = None
    try:
        assert readline_within(program.stdout, 10) == "running\n"
        started = time.monotonic()
        tracer = subprocess.Popen(
            [sys.executable, "-m", "probescope", "trace", "--engine", "ptrace", "-q",
             "-p", str(program.pid),
             f"{path}:mix a=%di:s64", f"r:{path}:mix r=$retval:s64", f"r:{path}:layer"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if early:
            time.sleep(rng.uniform(0, max(startup) if startup else 1.0))
            tally.early += 1
        else:
            first = readline_within(tracer.stdout, 60)
            assert first, "no event from probescope"
            startup.append(time.monotonic() - started)
            time.sleep(rng.uniform(0, LATEST_KILL))
            tally.streaming += 1
        tracer.kill()
        tracer.wait(30)
        time.sleep(0.2)  # the program runs on untraced, through every kind of site
        program.stdin.write("stop\n")
        program.stdin.flush()
        result = readline_within(program.stdout, 120)
        if result == "threads with a correct checksum: 4 of 4, signals 0\n":
            text = text_differences(program.pid, path)
            traced_by = tracer_of(program.pid)
            program.stdin.write("exit\n")
            program.stdin.flush()
            status = program.wait(30)
            if status == 0 and traced_by == 0:
                tally.survived += 1
            if not text:
                tally.restored += 1
        else:
            program.wait(30)
            tally.failures.append(
                f"run {tally.runs}: {result.strip() or 'no output'}, status {program.returncode}"
            )
    finally:
        tally.runs += 1
        for process in (tracer, program):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_sigkill_of_probescope_at_random_moments(target):
    builds = [
        target("hammer.c", ("-O0", "-g", "-pthread")),
        target("hammer.c", ("-O2", "-g", "-pthread"), output="hammer-O2"),
    ]
    seed = int(os.environ.get("PROBESCOPE_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    early_runs = set(rng.sample(range(RUNS), EARLY))
    tally = Tally()
    startup: list[float] = []
    for run in range(RUNS):
        _one_run(builds[run % 2], run in early_runs, run % 4 >= 2, startup, tally, rng)
    print(f"\n{tally.line()} (seed {seed})")
    assert not tally.failures, tally.line() + "\n" + "\n".join(tally.failures)
    assert tally.survived == tally.restored == RUNS, tally.line()


@pytest.mark.parametrize("optimize", ["-O0", "-O2"])
@pytest.mark.parametrize("kind", ["entry", "return"])
@pytest.mark.parametrize("blocked", [False, True])
def test_sigkill_while_a_thread_is_stopped_in_a_hit(target, optimize, kind, blocked):
    """The states a kill can catch, made certain: a handler holds a thread inside a hit not
    yet served (on the entry's trap byte, or at the trampoline) while the tracer process is
    SIGKILLed; the program's threads may block every signal."""
    path = target("hammer.c", (optimize, "-g", "-pthread"), output=f"hammer{optimize}")
    driver = Path(__file__).with_name("hold_driver.py")
    for _ in range(1):
        program = subprocess.Popen(
            [str(path), "4", *(["blocked"] if blocked else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert readline_within(program.stdout, 10) == "running\n"
            holder = subprocess.Popen(
                [sys.executable, str(driver), str(path), str(program.pid), kind],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert readline_within(holder.stdout, 60) == "holding\n"
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
            time.sleep(0.2)
            program.stdin.write("stop\n")
            program.stdin.flush()
            assert readline_within(program.stdout, 120) == (
                "threads with a correct checksum: 4 of 4, signals 0\n"
            )
            assert text_differences(program.pid, path) == []
            program.stdin.write("exit\n")
            program.stdin.flush()
            assert program.wait(30) == 0
        finally:
            if program.poll() is None:
                program.kill()
                program.wait()


# Reads numbers from stdin; for each, calls `step` and prints what it returned.
ECHO = r"""
#include <stdio.h>
__attribute__((noinline)) long step(long n) { return n * 3 + 1; }
int main(void) {
    long n;
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (scanf("%ld", &n) == 1)
        printf("%ld\n", step(n));
    return 0;
}
"""


def test_a_later_probescope_takes_over_what_a_killed_one_left(build):
    """Killed while the program is idle, probescope leaves its traps in; the next one to
    attach puts those bytes back (from the killed one's site table), takes over its signal
    handlers and, once it detaches, leaves the program as it was found."""
    path = build(ECHO, "echo_step")
    driver = Path(__file__).with_name("tracer_driver.py")
    program = subprocess.Popen(
        [str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        dispositions = proc_status(program.pid)["SigCgt"]

        def ask(n: int) -> str:
            program.stdin.write(f"{n}\n")
            program.stdin.flush()
            return readline_within(program.stdout, 30)

        assert ask(1) == "4\n"
        tracers = []
        for n in (2, 3):
            tracer = subprocess.Popen(
                [sys.executable, str(driver), str(path), "step", "-", "--pid", str(program.pid)],
                stdout=subprocess.PIPE,
                text=True,
            )
            tracers.append(tracer)
            assert readline_within(tracer.stdout, 60) == "attached\n"
            assert ask(n) == f"{3 * n + 1}\n"
            assert readline_within(tracer.stdout, 30).startswith(f"event 1 {n} ")
            if n == 2:
                tracer.kill()  # its traps stay in: the program waits in read()
                tracer.wait(30)
                assert text_differences(program.pid, path)
        tracers[-1].send_signal(signal.SIGTERM)
        assert tracers[-1].wait(30) == 0
        assert ask(4) == "13\n"
        assert tracer_of(program.pid) == 0
        assert text_differences(program.pid, path) == []
        assert proc_status(program.pid)["SigCgt"] == dispositions
    finally:
        program.kill()
        program.wait()
