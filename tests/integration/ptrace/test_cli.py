"""`probescope trace --engine ptrace` as a user runs it: the defects issue 16 found in the
ptrace engine's command-line use — a pid given twice, a `-c` command outliving a broken pipe,
`usdt:` specs refused, characters printed as numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROBESCOPE = [sys.executable, "-m", "probescope", "trace", "--engine", "ptrace"]

# A program that writes its pid to argv[1], then calls `tick` every millisecond for a minute.
TICKER = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) long tick(long i) { return i * 7; }
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "w");
    fprintf(f, "%d\n", getpid());
    fclose(f);
    long sum = 0;
    for (long i = 0; i < 60000; i++) {
        sum += tick(i);
        usleep(1000);
    }
    return sum == 0;
}
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_pid_given_twice_is_traced_once(target):
    path = target("spin.c")
    program = subprocess.Popen([path], stdout=subprocess.PIPE)
    try:
        program.stdout.readline()
        done = subprocess.run(
            [*PROBESCOPE, "-p", str(program.pid), "-p", str(program.pid), "-n", "3",
             f"{path}:tick i=arg1:s64"],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "another tracer" not in done.stderr and "already traced" not in done.stderr
        assert done.stdout.count(" tick: (") == 3
    finally:
        program.kill()
        program.wait()


def test_a_broken_pipe_ends_the_command_too(build, tmp_path):
    ticker = build(TICKER, "ticker")
    pidfile = tmp_path / "pid"
    pipeline = subprocess.Popen(
        f"{' '.join(PROBESCOPE)} -c '{ticker} {pidfile}' '{ticker}:tick i=arg1:s64' | head -n 2",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out, _ = pipeline.communicate(timeout=120)
    assert len(out.splitlines()) == 2
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the command outlived the session"


def test_usdt_specs_run_on_the_ptrace_engine():
    python = Path("/usr/bin/python3.11")
    if not python.exists():
        pytest.skip("no /usr/bin/python3.11 (its python:gc__start SDT probe is the example)")
    done = subprocess.run(
        [*PROBESCOPE, "-c", f"{python} -c 'import gc; gc.collect(); gc.collect()'",
         f"usdt:{python}:python:gc__start"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": python_gc__start: (") >= 2
    assert "command exited with status 0" in done.stderr


def test_chars_print_as_characters_in_text_and_json(target):
    path = target("loop.c")
    spec = f"{path}:work c=+0(arg2):char s=+0(arg2):char[4] n=arg1:s32"
    text = subprocess.run(
        [*PROBESCOPE, "-q", "-c", f"{path} 2", spec],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert " c='e' s={'e','v','e','n'} n=0" in text.stdout, text.stdout + text.stderr
    lines = subprocess.run(
        [*PROBESCOPE, "-q", "-f", "jsonl", "-c", f"{path} 2", spec],
        capture_output=True,
        text=True,
        timeout=120,
    )
    first = json.loads(lines.stdout.splitlines()[0])
    assert first["args"] == {"c": "e", "s": ["e", "v", "e", "n"], "n": 0}
    assert os.path.basename(path) in first["comm"]


def test_a_command_gets_sigterm_when_probescope_is_killed(build, tmp_path):
    """As the README promises for every engine (PR_SET_PDEATHSIG); the dead man's switch
    keeps the command from dying of our traps before that."""
    ticker = build(TICKER, "ticker")
    pidfile = tmp_path / "pid"
    tracer = subprocess.Popen(
        [*PROBESCOPE, "-c", f"{ticker} {pidfile}", f"{ticker}:tick i=arg1:s64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert tracer.stdout.readline()
        pid = int(pidfile.read_text())
        tracer.kill()
        tracer.wait(30)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
