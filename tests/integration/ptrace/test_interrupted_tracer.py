"""probescope interrupted with Ctrl-C (SIGINT) at random moments while it traces a busy
program: it detaches cleanly every time, whatever each thread was doing — inside a hit, at the
trampoline, with hijacked returns pending, with signals queued for it — and the program ends
exactly as it would have (issue 16, item 1).

50 runs of `probescope trace --engine ptrace -p PID` on a program whose four threads hammer
entry- and return-probed functions (built -O0 and -O2) while the test sends it real-time
signals (each one queued, so a lost or doubled one shows); SIGINT lands while probescope
attaches (just after the program shows a tracer) or while it streams. Each time probescope
must exit by itself, quietly, and leave the program untraced, with its text, mappings, signal
dispositions and CPU affinity as before, and every signal delivered once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.processes import proc_status, readline_within, text_differences

pytestmark = pytest.mark.slow

RUNS = int(__import__("os").environ.get("PROBESCOPE_STRESS_RUNS", 50))
DURING_ATTACH = int(__import__("os").environ.get("PROBESCOPE_STRESS_ATTACH", RUNS // 5))
LATEST_INTERRUPT = 0.5  # seconds after the first event


@dataclass
class Tally:
    runs: int = 0
    during_attach: int = 0
    streaming: int = 0
    clean_exits: int = 0
    programs_intact: int = 0
    signals_sent: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"SIGINT tally: {self.runs} runs ({self.during_attach} during attach, "
            f"{self.streaming} while streaming); probescope exited cleanly {self.clean_exits}, "
            f"program intact {self.programs_intact} (text, mappings, signal dispositions, "
            f"affinity, output, exit status, {self.signals_sent} queued signals delivered)"
        )


def _anonymous_code(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if line.split()[1] == "r-xp" and len(line.split()) == 5]


class Signals:
    """Sends SIGRTMIN to a process at random intervals until stopped; counts them."""

    def __init__(self, pid: int, rng: random.Random) -> None:
        self.pid, self.rng, self.sent = pid, rng, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(0.001, 0.01)):
            os.kill(self.pid, signal.SIGRTMIN)
            self.sent += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.sent


def _problems(program: subprocess.Popen[str], path: Path, before: dict[str, object]) -> list[str]:
    pid = program.pid
    time.sleep(0.01)
    if program.poll() is not None:
        return [f"the program died (status {program.returncode})"]
    problems = []
    status = proc_status(pid)
    if status["TracerPid"] != "0":
        problems.append(f"still traced by {status['TracerPid']}")
    differences = text_differences(pid, path)
    if differences:
        problems.append(f"text differs at {', '.join(hex(a) for a in differences[:4])}")
    if _anonymous_code(pid) != before["code"]:
        problems.append("our pages are still mapped")
    if (status["SigCgt"], status["SigIgn"]) != before["dispositions"]:
        problems.append(f"signal dispositions changed: {status['SigCgt']}")
    if os.sched_getaffinity(pid) != before["affinity"]:
        problems.append("CPU affinity changed")
    return problems


def _one_run(path: Path, during_attach: bool, tally: Tally, rng: random.Random) -> None:
    program = subprocess.Popen(
        [str(path), "4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    tracer = None
    signals = None
    try:
        assert readline_within(program.stdout, 10) == "running\n"
        status = proc_status(program.pid)
        before: dict[str, object] = {
            "code": _anonymous_code(program.pid),
            "dispositions": (status["SigCgt"], status["SigIgn"]),
            "affinity": os.sched_getaffinity(program.pid),
        }
        signals = Signals(program.pid, rng)
        tracer = subprocess.Popen(
            [sys.executable, "-m", "probescope", "trace", "--engine", "ptrace", "-q",
             "-p", str(program.pid),
             f"{path}:mix a=%di:s64", f"r:{path}:mix r=$retval:s64", f"r:{path}:layer"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        if during_attach:
            deadline = time.monotonic() + 60
            while proc_status(program.pid)["TracerPid"] == "0" and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.05))
            tally.during_attach += 1
        else:
            assert readline_within(tracer.stdout, 60), "no event from probescope"
            time.sleep(rng.uniform(0, LATEST_INTERRUPT))
            tally.streaming += 1
        tracer.send_signal(signal.SIGINT)
        try:
            _, errors = tracer.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            tally.failures.append(f"run {tally.runs}: probescope hung after SIGINT")
            tracer.kill()
            _, errors = tracer.communicate()
        else:
            if tracer.returncode in (0, 130) and b"Traceback" not in errors:
                tally.clean_exits += 1
            else:
                tally.failures.append(
                    f"run {tally.runs}: probescope exited {tracer.returncode}: "
                    f"{errors.decode(errors='replace')[-500:]}"
                )
        problems = _problems(program, path, before)
        sent = signals.stop()
        if program.poll() is not None:
            tally.failures.append(f"run {tally.runs}: " + "; ".join(problems))
            return
        time.sleep(0.05)
        program.stdin.write("stop\n")
        program.stdin.flush()
        result = readline_within(program.stdout, 120)
        expected = f"threads with a correct checksum: 4 of 4, signals {sent}\n"
        if result != expected:
            problems.append(f"printed {result!r}, expected {expected!r}")
        program.stdin.write("exit\n")
        program.stdin.flush()
        if program.wait(30) != 0:
            problems.append(f"exit status {program.returncode}")
        if problems:
            tally.failures.append(f"run {tally.runs}: " + "; ".join(problems))
        else:
            tally.programs_intact += 1
            tally.signals_sent += sent
    finally:
        tally.runs += 1
        if signals is not None:
            signals.stop()
        for process in (tracer, program):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_sigint_at_random_moments_detaches_cleanly(target):
    builds = [
        target("hammer.c", ("-O0", "-g", "-pthread")),
        target("hammer.c", ("-O2", "-g", "-pthread"), output="hammer-O2"),
    ]
    seed = int(os.environ.get("PROBESCOPE_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    attach_runs = set(rng.sample(range(RUNS), DURING_ATTACH))
    tally = Tally()
    for run in range(RUNS):
        _one_run(builds[run % 2], run in attach_runs, tally, rng)
    print(f"\n{tally.line()} (seed {seed})")
    assert not tally.failures, tally.line() + "\n" + "\n".join(tally.failures)
