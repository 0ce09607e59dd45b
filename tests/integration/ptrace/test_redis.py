"""The case issue 16 found on a real server: Ctrl-C into `probescope trace --engine ptrace -p`
on a busy redis-server with an entry and a return probe on `processCommand`, under
redis-benchmark. It used to hang with redis frozen in ptrace-stop, or let redis die later on
an int3 of our page. Each try must end probescope by itself and leave redis serving, untraced,
its text as in the file; and a SIGKILLed probescope must leave it serving too."""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.processes import text_differences, tracer_of

pytestmark = pytest.mark.slow

TRIES = 8
SERVER = shutil.which("redis-server")
BENCHMARK = shutil.which("redis-benchmark")
CLIENT = shutil.which("redis-cli")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    if not (SERVER and BENCHMARK and CLIENT):
        pytest.skip("redis-server and redis-tools are not installed (Makefile TEST_PACKAGES)")
    port = _free_port()
    server = subprocess.Popen(
        [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while _ping(port) != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield server, port
    finally:
        server.kill()
        server.wait()


def _ping(port: int) -> str:
    done = subprocess.run(
        [str(CLIENT), "-p", str(port), "ping"], capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip()


def _trace(pid: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "probescope", "trace", "--engine", "ptrace", "-q", "-p", str(pid),
         f"{SERVER}:processCommand", f"r:{SERVER}:processCommand rc=retval:s32"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _first_event(tracer: subprocess.Popen[bytes]) -> bool:
    assert tracer.stdout is not None
    ready, _, _ = select.select([tracer.stdout], [], [], 60)
    return bool(ready and tracer.stdout.readline())


def _serving(server: subprocess.Popen[bytes], port: int, label: str) -> list[str]:
    problems = []
    if server.poll() is not None:
        return [f"{label}: redis-server died (status {server.returncode})"]
    if tracer_of(server.pid) != 0:
        problems.append(f"{label}: still traced")
    if text_differences(server.pid, str(SERVER)):
        problems.append(f"{label}: text differs from the file")
    key = f"probescope-{label}"
    subprocess.run([str(CLIENT), "-p", str(port), "set", key, "ok"], capture_output=True)
    got = subprocess.run(
        [str(CLIENT), "-p", str(port), "get", key], capture_output=True, text=True
    ).stdout.strip()
    if got != "ok":
        problems.append(f"{label}: GET answered {got!r}")
    return problems


def _interrupt(tracer: subprocess.Popen[bytes], label: str) -> list[str]:
    """Ctrl-C: probescope must exit by itself, quietly."""
    tracer.send_signal(signal.SIGINT)
    try:
        _, errors = tracer.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        return [f"{label}: probescope hung after Ctrl-C"]
    if tracer.returncode not in (0, 130) or b"Traceback" in errors:
        return [f"{label}: probescope exited {tracer.returncode}"]
    return []


def _kill(tracer: subprocess.Popen[bytes], label: str) -> list[str]:
    """SIGKILL: nothing of probescope runs after it; the server must not notice."""
    tracer.kill()
    tracer.wait(30)
    return []


@pytest.mark.parametrize(
    ("how", "end_tracer"), [("Ctrl-C", _interrupt), ("SIGKILL", _kill)], ids=["ctrl_c", "sigkill"]
)
def test_probescope_ended_under_redis_benchmark(redis, how, end_tracer):
    server, port = redis
    rng = random.Random(int(os.environ.get("PROBESCOPE_TEST_SEED", time.time_ns() % 1000)))
    problems: list[str] = []
    for attempt in range(TRIES):
        benchmark = subprocess.Popen(
            [str(BENCHMARK), "-p", str(port), "-n", "20000", "-c", "20", "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        tracer = _trace(server.pid)
        try:
            assert _first_event(tracer), "no event from probescope"
            time.sleep(rng.uniform(0.1, 1.5))
            problems += end_tracer(tracer, f"try {attempt}")
            benchmark.wait(120)
            problems += _serving(server, port, f"try {attempt}")
        finally:
            for process in (tracer, benchmark):
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if server.poll() is not None:
            break
    print(f"\nredis {how} tally: {TRIES} tries, {len(problems)} problems")
    assert not problems, "\n".join(problems)
