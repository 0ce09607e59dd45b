"""Chaos (issue 11 item 6): probescope ended by a random signal — SIGINT, SIGTERM, SIGHUP,
SIGKILL, or its output closed — at a random moment of a random phase (resolution, attach,
streaming, teardown) while it traces a running program with an entry and a return probe; 50
runs per engine (tracefs and ptrace). After every run, within 2 s and with no other probescope
command run in between: nothing of that session left in tracefs (dynamic event, instance,
event group), `current_tracer` untouched, probescope without a traceback, and the traced
program's output and exit status those of an untraced run. The tally is printed.

PROBESCOPE_CHAOS_RUNS sets the runs per engine (default 50), PROBESCOPE_CHAOS_SEED the seed.
"""

from __future__ import annotations

import collections
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.build import compile_program
from support.tracefs import owned_by, skip_reason, tracefs_root

RUNS = int(os.environ.get("PROBESCOPE_CHAOS_RUNS", "50"))
SEED = int(os.environ.get("PROBESCOPE_CHAOS_SEED", str(random.SystemRandom().randrange(1 << 30))))
KINDS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "closed stdout")
PHASES = ("resolution", "attach", "streaming", "teardown")
CALLS = 6000
EXPECTED = f"calls {CALLS} sum {sum(i * 7 + (i >> 3) for i in range(CALLS))}\n"
SOURCE = Path(__file__).parents[2] / "targets" / "chaos.c"


@dataclass
class Tally:
    engine: str
    runs: int = 0
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    phases: collections.Counter[str] = field(default_factory=collections.Counter)
    exits: collections.Counter[str] = field(default_factory=collections.Counter)
    leftovers: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)

    def report(self) -> str:
        def counts(counter: collections.Counter[str]) -> str:
            return ", ".join(f"{key} {n}" for key, n in sorted(counter.items()))

        return (
            f"chaos [{self.engine}, seed {SEED}]: {self.runs} runs; kills by kind: "
            f"{counts(self.kills)}; by phase: {counts(self.phases)}; probescope exits: "
            f"{counts(self.exits)}; leftovers {len(self.leftovers)}; crashes "
            f"{len(self.crashes)}"
            + "".join(f"\n  leftover: {item}" for item in self.leftovers)
            + "".join(f"\n  crash: {item}" for item in self.crashes)
        )


class Output:
    """probescope's stdout, read without blocking so it never fills, until it is closed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self.lines = 0
        self.closed = False

    def pump(self) -> None:
        if self.closed:
            return
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not data:
                return
            self.lines += data.count(b"\n")

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
            self.closed = True


def wait_until(condition: Callable[[], bool], output: Output, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output.pump()
        if condition():
            return True
        if not output.closed:
            select.select([output.fd], [], [], 0.002)
        else:
            time.sleep(0.002)
    return False


def attach_started(engine: str, session: int, target: int) -> bool:
    """The session began to change the kernel or the program."""
    if engine == "tracefs":
        root = tracefs_root()
        return root is not None and any((root / "instances").glob(f"probescope-{session}-*"))
    try:
        status = Path(f"/proc/{target}/status").read_text()
    except OSError:
        return False
    return f"TracerPid:\t{session}\n" in status


def current_tracer() -> str:
    root = tracefs_root()
    return (root / "current_tracer").read_text() if root is not None else ""


STARTUP_FILES = ("probescope/__init__.py", "probescope/__main__.py", "probescope/cli/__init__.py")


def interrupted_at_interpreter_start(stderr: str) -> bool:
    """A SIGINT that Python turned into KeyboardInterrupt before any code of probescope's
    could handle it: while the interpreter starts and runpy imports the package, whose only
    frames are these import-free modules' top levels (the command's own guard begins in
    `probescope.cli.main`). No Python program can install a handler earlier."""
    lines = stderr.strip().splitlines()
    if not lines or lines[-1] != "KeyboardInterrupt":
        return False
    files = re.findall(r'File "([^"]+)"', stderr)
    ours = [f for f in files if "/probescope/" in f]
    return all(f.endswith(STARTUP_FILES) for f in ours)


def one_run(
    engine: str, kind: str, phase: str, rng: random.Random, program: Path, tally: Tally
) -> None:
    tracer_before = current_tracer()
    target = subprocess.Popen([str(program), str(CALLS)], stdout=subprocess.PIPE, text=True)
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "probescope",
            "trace",
            "--engine",
            engine,
            "-p",
            str(target.pid),
            f"{program}:work i=arg1:s64",
            f"r:{program}:work ret=retval:s64",
        ],
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=subprocess.PIPE,
    )
    os.close(write_end)
    output = Output(read_end)
    label = f"run {tally.runs} ({kind} during {phase})"
    try:
        if phase == "resolution":
            wait_until(lambda: False, output, rng.uniform(0.0, 0.3))
        elif phase == "attach":
            wait_until(lambda: attach_started(engine, proc.pid, target.pid), output, 30)
            wait_until(lambda: False, output, rng.uniform(0.0, 0.02))
        else:
            wait_until(lambda: output.lines > 0 or proc.poll() is not None, output, 30)
            if phase == "streaming":
                wait_until(lambda: False, output, rng.uniform(0.0, 0.4))
            else:
                proc.send_signal(signal.SIGINT)  # the teardown starts
                wait_until(lambda: False, output, rng.uniform(0.0, 0.08))
        if phase == "teardown":
            observed = "teardown"
        elif output.lines:
            observed = "streaming"
        elif attach_started(engine, proc.pid, target.pid):
            observed = "attach"
        else:
            observed = "resolution"
        if kind == "closed stdout":
            output.close()
        elif proc.poll() is None:
            proc.send_signal(getattr(signal, kind))
        tally.kills[kind] += 1
        tally.phases[observed] += 1
        if not wait_until(lambda: proc.poll() is not None, output, 30):
            tally.crashes.append(f"{label}: probescope hung")
            proc.kill()
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode(errors="replace")
        proc.wait()
        status = proc.returncode
        tally.exits[f"signal {-status}" if status < 0 else str(status)] += 1
        if "Traceback" in stderr and not interrupted_at_interpreter_start(stderr):
            tally.crashes.append(f"{label}: traceback\n{stderr}")
        gone = wait_until(lambda: not owned_by(proc.pid), output, 2.0)
        if not gone:
            tally.leftovers.append(f"{label}: {owned_by(proc.pid)}")
        if current_tracer() != tracer_before:
            tally.leftovers.append(f"{label}: current_tracer is now {current_tracer()!r}")
        out, _ = target.communicate(timeout=60)
        if target.returncode != 0 or out != EXPECTED:
            tally.crashes.append(
                f"{label}: the traced program ended with status {target.returncode}, output {out!r}"
            )
    finally:
        output.close()
        for process in (proc, target):
            if process.poll() is None:
                process.kill()
                process.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        tally.runs += 1


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["tracefs", "ptrace"])
def test_chaos(engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    if engine == "tracefs" and skip_reason() is not None:
        pytest.skip(skip_reason())
    program = compile_program(SOURCE.read_text(), "chaos", ("-O1", "-g"))
    rng = random.Random(f"{SEED}-{engine}")
    plan = [(kind, phase) for kind in KINDS for phase in PHASES]
    rng.shuffle(plan)
    tally = Tally(engine)
    for number in range(RUNS):
        kind, phase = plan[number % len(plan)]
        one_run(engine, kind, phase, rng, program, tally)
    with capsys.disabled():
        print("\n" + tally.report())
    assert tally.leftovers == [] and tally.crashes == [], tally.report()
