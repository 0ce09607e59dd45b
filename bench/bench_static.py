"""Benchmark of static tracing: the function tracer on a hot kernel function set plus sched
tracepoints under load, probescope beside `trace-cmd record` + `trace-cmd report`, in one run.

Run on the host: `.venv/bin/python bench/bench_static.py [--levels 2000,0] [--reps 3] ...`.
The host kernel refuses the function tracer (and with it `trace-cmd record`), so the whole
measurement runs in the test VM (tests/vm: Debian's 6.1 kernel under QEMU, 10-20x slower than
the host under TCG — compare ratios, not absolute rates). The host boots the guest, builds the
load generator into the guest's shared directory, runs this file again inside the guest with
`--inside-guest`, and prints the tables from the JSON the guest part writes. Without a guest
(no QEMU, no kernel package) it says why and exits with status 3.

In the guest, for every load level and repetition, interleaved (the order of the tools
alternates):
  - load: PAIRS pairs of processes ping-ponging one byte over two pipes (each round trip is
    two vfs_write, two vfs_read, and the wakeups and context switches they cause), paced at
    RATE round trips per second in 1 ms steps (0: flat out) for SECONDS;
  - trace-cmd: `trace-cmd record -k -F -c -b KB -p function -l vfs_read -l vfs_write
    -e sched:sched_switch -e sched:sched_wakeup -o trace.dat LOAD` (-k: the benchmark resets
    the tracer itself, see trace_cmd_record_argv), then `trace-cmd report` of it, timed.
    Lost = overrun + commit overrun + dropped events of `report --stat` (the ring-buffer stats
    trace-cmd saved) and `[EVENTS DROPPED]` markers in the report;
  - probescope: `probescope trace f:vfs_read f:vfs_write t:sched:sched_switch
    t:sched:sched_wakeup -c LOAD -o FILE --buffer-size KB`, the real CLI, in a process that
    also notes its own CPU time when the session is attached, when the sink has written its
    first batch and when the session closes: attach to close is the streaming loop (read
    sub-buffers, decode, format text, write). Lost = the session summary's (sub-buffer loss
    flags, ring-buffer overrun and drops);
  - probescope-warm (--warm-delay, a diagnostic): the same with the load idle for a few
    seconds first, so probescope's one-time set-up at its first batch is over when the load
    starts.
  All trace the load and its children only (pid filtering with fork following), with the same
  per-CPU buffer size. Decode speed: events per CPU second of `trace-cmd report`, and of
  probescope's streaming loop (which also does the recording, so it is the harder side).
Then once, decode speed on identical input: the flat-out load traced into a private instance
written by hand, its sub-buffers read raw from trace_pipe_raw; probescope decodes them (into
Events, and into kernel-format text, checked line by line against the instance's `trace`),
and `trace-cmd report` reads a trace.dat made from those very sub-buffers by `trace-cmd
restore` (as bench_tracefs.py part (b) does). `--profile` adds a cProfile of probescope (one
extra run per level, and the text decode) to the report.

Targets (issue 5): zero lost events at every load trace-cmd records without loss; decode speed
within 2x of trace-cmd report (ratio probescope / trace-cmd >= 0.5).
Everything created in the guest's tracefs is removed on every exit path (the hand-made
instance, the top-level tracer back to nop with filters, pids and events cleared after
trace-cmd); probescope's own leftovers are checked after each run. The guest dies afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import repeat
from pathlib import Path
from typing import IO, Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
FUNCTIONS = ("vfs_read", "vfs_write")
TRACEPOINTS = ("sched:sched_switch", "sched:sched_wakeup")
PROBESCOPE_SPECS = [f"f:{f}" for f in FUNCTIONS] + [f"t:{t}" for t in TRACEPOINTS]
GUEST_TIMEOUT = 1200.0
SINK_BATCH = 4096  # events per write_batch in the identical-input text decode

# `static_load PAIRS RATE SECONDS [DELAY]`: PAIRS pairs of processes; in each pair the pinger
# writes a byte into one pipe and reads it back from the other, the echoer copies it across.
# RATE is round trips per second over all pairs, kept in 1 ms steps (0: as fast as possible).
# DELAY: seconds to sleep first. Prints the round trips made, the wall time from the end of the
# delay, and the CPU time of all its processes.
LOAD_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_of(int who)
{
    struct rusage u;
    getrusage(who, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec
        + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static void echo_back(int in, int out)
{
    char byte;
    while (read(in, &byte, 1) == 1)
        if (write(out, &byte, 1) != 1)
            break;
    _exit(0);
}

static long ping(int out, int in, double rate, double seconds)
{
    struct timespec pause = {0, 1000000};
    double start = now(), elapsed;
    long made = 0;
    char byte = 'x';
    while ((elapsed = now() - start) < seconds) {
        long due = rate > 0 ? (long)(rate * elapsed) : made + 256;
        while (made < due) {
            if (write(out, &byte, 1) != 1 || read(in, &byte, 1) != 1)
                return made;
            made++;
        }
        if (rate > 0)
            nanosleep(&pause, NULL);
    }
    return made;
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s PAIRS RATE SECONDS [DELAY]\n", argv[0]);
        return 2;
    }
    int pairs = atoi(argv[1]);
    double rate = atof(argv[2]), seconds = atof(argv[3]), delay = argc == 5 ? atof(argv[4]) : 0;
    if (pairs < 1 || pairs > 64 || rate < 0 || seconds <= 0 || delay < 0)
        return 2;
    struct timespec idle = {(time_t)delay, (long)((delay - (time_t)delay) * 1e9)};
    nanosleep(&idle, NULL);
    long *made = mmap(NULL, sizeof(long) * pairs, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (made == MAP_FAILED)
        return 1;
    double start = now();
    for (int i = 0; i < pairs; i++) {
        int there[2], back[2];
        if (pipe(there) || pipe(back))
            return 1;
        if (fork() == 0) {
            if (fork() == 0) {
                close(there[1]);
                close(back[0]);
                echo_back(there[0], back[1]);
            }
            close(there[0]);
            close(back[1]);
            made[i] = ping(there[1], back[0], rate / pairs, seconds);
            close(there[1]);
            while (wait(NULL) > 0)
                ;
            _exit(0);
        }
        close(there[0]);
        close(there[1]);
        close(back[0]);
        close(back[1]);
    }
    while (wait(NULL) > 0)
        ;
    long total = 0;
    for (int i = 0; i < pairs; i++)
        total += made[i];
    printf("rounds=%ld seconds=%.3f cpu_s=%.6f\n", total, now() - start,
           cpu_of(RUSAGE_SELF) + cpu_of(RUSAGE_CHILDREN));
    return 0;
}
"""
LOAD_LINE = re.compile(r"rounds=(\d+) seconds=([\d.]+) cpu_s=([\d.]+)")

# Runs the probescope CLI (argv after the first argument) in this process and writes what it
# measured to the JSON file named by the first argument: the process's CPU time when the
# session is attached, when the sink has written its first batch (which builds the printers:
# kernel symbols, print fmts) and when the session starts to close (the streaming loop lies
# between attach and close), and the session's summary.
PROBESCOPE_RUNNER = r"""
import json, os, resource, sys, time
from probescope import session as session_module
from probescope.cli import trace as trace_module
from probescope.cli.main import main

marks = {}
summaries = []

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

def mark(name):
    marks.setdefault(name, (cpu(), time.monotonic()))

Session = session_module.Session
original_start, original_close, original_summary = Session.start, Session.close, Session.summary

def start(self):
    result = original_start(self)
    mark("attached")
    return result

def close(self):
    mark("closing")
    return original_close(self)

def summary(self, *args, **kwargs):
    result = original_summary(self, *args, **kwargs)
    summaries.append(result)
    return result

Session.start, Session.close, Session.summary = start, close, summary
original_open_sink = trace_module.open_sink

def open_sink(*args, **kwargs):
    sink = original_open_sink(*args, **kwargs)
    write_batch = sink.write_batch

    def first_write_batch(batch):
        write_batch(batch)
        if batch.events and "first_batch" not in marks:
            mark("first_batch")
            marks["first_batch_events"] = len(batch.events)
            sink.write_batch = write_batch

    sink.write_batch = first_write_batch
    return sink

trace_module.open_sink = open_sink
began = time.monotonic()
profile_path = os.environ.get("PROBESCOPE_BENCH_PROFILE")
if profile_path:
    import cProfile
    profiler = cProfile.Profile()
    status = profiler.runcall(main, sys.argv[2:])
    profiler.dump_stats(profile_path)
else:
    status = main(sys.argv[2:])
mark("end")
report = {"status": status, "marks": marks, "began": began,
          "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
if summaries:
    last = summaries[-1]
    stats = last.stats
    report.update(events=last.total, lost=last.lost, hits=dict(last.hits), reason=last.reason,
                  ring_lost=stats.extra.get("ring_buffer_lost") if stats else None,
                  notes=list(stats.notes) if stats else [])
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
sys.exit(status)
"""


class Unavailable(Exception):
    """What the benchmark needs cannot be had here; the message says why."""


# --------------------------------------------------------------------------------------------
# results (JSON between the guest and the host)


@dataclass
class LoadRun:
    rounds: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.rounds / self.seconds if self.seconds else 0.0


@dataclass
class LiveRow:
    """One tool traced one load run."""

    tool: str
    level: int
    rep: int
    load: LoadRun
    events: int
    lost: int
    ring_lost: int | None
    record_cpu: float  # the recording process(es), load excluded, start-up included
    record_wall: float
    decode_cpu: float  # trace-cmd report; probescope's streaming loop
    decode_wall: float
    steady_events: int | None = None  # probescope: after the first batch written
    steady_cpu: float | None = None
    by_event: dict[str, int] = field(default_factory=dict)  # events per event name
    note: str = ""

    @property
    def decode_rate(self) -> float:
        return self.events / self.decode_cpu if self.decode_cpu else 0.0

    @property
    def steady_rate(self) -> float | None:
        if self.steady_events is None or not self.steady_cpu:
            return None
        return self.steady_events / self.steady_cpu


@dataclass
class DecodeResult:
    """Decoding the same captured sub-buffers, seconds per run."""

    events: int
    sub_buffers: int
    probescope_events: list[float] = field(default_factory=list)
    probescope_text: list[float] = field(default_factory=list)
    probescope_text_prepared: list[float] = field(default_factory=list)
    trace_cmd_report: list[float] = field(default_factory=list)
    report_events: int = 0
    text_check: str = ""
    skipped: str = ""


@dataclass
class Results:
    kernel: str
    cpus: int
    pairs: int
    seconds: float
    buffer_kb: int
    levels: list[int]
    reps: int
    warm_delay: float
    live: list[LiveRow] = field(default_factory=list)
    decode: DecodeResult | None = None
    errors: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)
    wall: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        live = [LiveRow(**{**row, "load": LoadRun(**row["load"])}) for row in data.pop("live")]
        decode = data.pop("decode")
        return cls(**data, live=live, decode=DecodeResult(**decode) if decode else None)


# --------------------------------------------------------------------------------------------
# processes


@dataclass(frozen=True)
class Finished:
    returncode: int
    wall: float
    cpu: float  # the process and every child it waited for
    stdout: str
    stderr: str


def run_measured(
    argv: Sequence[str],
    *,
    stdout_path: Path | None = None,
    timeout: float = 600.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> Finished:
    """Run argv to its end; wait4(2) gives the CPU time of it and its waited-for children. The
    process gets its own process group, all killed after `timeout` seconds; the benchmark
    sleeps in wait4 meanwhile, taking no CPU from what it measures."""
    with tempfile.TemporaryFile() as err, contextlib.ExitStack() as stack:
        out: Any = (
            stack.enter_context(open(stdout_path, "wb"))
            if stdout_path is not None
            else stack.enter_context(tempfile.TemporaryFile())
        )
        started = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
        )
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        wall = time.monotonic() - started
        if expired.is_set():
            raise RuntimeError(f"{argv[0]} ran longer than {timeout:.0f} s: killed")
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text_out = ""
        if stdout_path is None:
            out.seek(0)
            text_out = out.read().decode(errors="replace")
        return Finished(
            process.returncode,
            wall,
            usage.ru_utime + usage.ru_stime,
            text_out,
            err.read().decode(errors="replace"),
        )


def parse_load(text: str, what: str) -> LoadRun:
    match = LOAD_LINE.search(text)
    if match is None:
        raise RuntimeError(f"{what}: the load printed no report:\n{text[-2000:]}")
    return LoadRun(int(match.group(1)), float(match.group(2)), float(match.group(3)))


def load_argv(load: Path, pairs: int, rate: int, seconds: float, delay: float = 0) -> list[str]:
    return [str(load), str(pairs), str(rate), f"{seconds:g}"] + ([f"{delay:g}"] if delay else [])


# --------------------------------------------------------------------------------------------
# tracefs by hand (the benchmark sets up its own capture and checks cleanup without relying on
# the code it measures)


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _stats(path: Path) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            values[key.strip()] = int(value)
    return values


TOP_LEVEL_SAVED = ("buffer_size_kb", "options/event-fork", "options/function-fork", "tracing_on")


@contextlib.contextmanager
def top_level_restored() -> Iterator[None]:
    """trace-cmd record works in the top-level instance and, with -k, leaves its settings: the
    tracer goes off first (so the emptied filter never selects every function while it is on),
    then filters, pids and events are cleared and the saved values put back."""
    saved = {name: (TRACEFS / name).read_text().split("\n")[0] for name in TOP_LEVEL_SAVED}
    saved["buffer_size_kb"] = saved["buffer_size_kb"].split()[0]
    try:
        yield
    finally:
        _write(TRACEFS / "current_tracer", "nop")
        _write(TRACEFS / "set_ftrace_filter", "")
        _write(TRACEFS / "set_ftrace_pid", "")
        _write(TRACEFS / "set_event", "")
        _write(TRACEFS / "set_event_pid", "")
        for name in ("options/event-fork", "options/function-fork", "tracing_on"):
            _write(TRACEFS / name, saved[name])
        if (TRACEFS / "buffer_size_kb").read_text().split()[0] != saved["buffer_size_kb"]:
            _write(TRACEFS / "buffer_size_kb", saved["buffer_size_kb"])


def probescope_leftovers() -> list[str]:
    found = [p.name for p in (TRACEFS / "instances").iterdir() if "probescope" in p.name]
    found += [p.name for p in (TRACEFS / "events").iterdir() if p.name.startswith("probescope")]
    return found


@dataclass(frozen=True)
class Capture:
    """Sub-buffers of every CPU read raw from a hand-made instance, and what decodes them."""

    raw: dict[int, bytes]
    header_page: str
    header_event: str
    formats: dict[str, str]  # "system/event" -> format text
    comms: bytes  # saved_cmdlines
    trace_text: bytes
    entries: int
    lost: int


@contextlib.contextmanager
def hand_instance(buffer_kb: int) -> Iterator[Path]:
    """Instance `probescope-bench-static-<pid>` with the function tracer on FUNCTIONS and the
    sched events enabled, tracing off; on exit tracer nop, filter emptied, events off, removed."""
    root = TRACEFS / "instances" / f"probescope-bench-static-{os.getpid()}"
    os.mkdir(root)
    try:
        _write(root / "tracing_on", "0")
        _write(root / "buffer_size_kb", str(buffer_kb))
        _write(root / "options/overwrite", "0")
        _write(root / "set_ftrace_filter", " ".join(FUNCTIONS))
        for name in TRACEPOINTS:
            _write(root / "events" / name.replace(":", "/") / "enable", "1")
        _write(root / "current_tracer", "function")
        yield root
    finally:
        with contextlib.suppress(OSError):
            _write(root / "tracing_on", "0")
        with contextlib.suppress(OSError):
            _write(root / "current_tracer", "nop")
        with contextlib.suppress(OSError):
            _write(root / "set_ftrace_filter", "")
        for name in TRACEPOINTS:
            with contextlib.suppress(OSError):
                _write(root / "events" / name.replace(":", "/") / "enable", "0")
        for _ in range(50):
            try:
                os.rmdir(root)
                break
            except OSError:
                time.sleep(0.1)
        else:
            os.rmdir(root)


def read_raw(path: Path, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, size)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def capture(load: list[str], buffer_kb: int) -> Capture:
    from probescope.traceevent.format import parse_header_page

    with hand_instance(buffer_kb) as root:
        _write(root / "tracing_on", "1")
        try:
            done = run_measured(load)
        finally:
            _write(root / "tracing_on", "0")
        if done.returncode != 0:
            raise RuntimeError(f"the load failed: {done.stderr[-500:]}")
        cpus = sorted(int(p.name[3:]) for p in (root / "per_cpu").glob("cpu*"))
        stats = {cpu: _stats(root / "per_cpu" / f"cpu{cpu}" / "stats") for cpu in cpus}
        trace_text = (root / "trace").read_bytes()
        header_page = (root / "events/header_page").read_text()
        size = parse_header_page(header_page).sub_buffer_size
        raw = {
            cpu: read_raw(root / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw", size) for cpu in cpus
        }
        formats = {
            f"{system}/{event}": (TRACEFS / "events" / system / event / "format").read_text()
            for system, event in [("ftrace", "function")]
            + [tuple(name.split(":")) for name in TRACEPOINTS]
        }
        return Capture(
            raw,
            header_page,
            (root / "events/header_event").read_text(),
            formats,
            (TRACEFS / "saved_cmdlines").read_bytes(),
            trace_text,
            sum(s.get("entries", 0) for s in stats.values()),
            sum(
                s.get(k, 0)
                for s in stats.values()
                for k in ("overrun", "commit overrun", "dropped events")
            ),
        )


# --------------------------------------------------------------------------------------------
# trace-cmd


DROPPED = re.compile(rb"^CPU:\d+ \[(?:(\d+) )?EVENTS DROPPED\]$", re.M)


REPORT_EVENT = re.compile(rb" \d+\.\d+: +([\w:]+):")


def count_report(path: Path) -> tuple[int, int, dict[str, int]]:
    """(event lines, events the report says were dropped, lines per event name) of a
    `trace-cmd report` output."""
    events = dropped = 0
    by_name: Counter[bytes] = Counter()
    with path.open("rb") as stream:
        for line in stream:
            if line.startswith((b"cpus=", b"version = ")):
                continue
            match = DROPPED.match(line.rstrip(b"\n"))
            if match:
                dropped += int(match.group(1) or 1)
                continue
            events += 1
            name = REPORT_EVENT.search(line)
            by_name[name.group(1) if name else b"?"] += 1
    return events, dropped, {key.decode(): value for key, value in by_name.items()}


def report_stat_lost(trace_dat: Path) -> int:
    """Overrun + commit overrun + dropped events over the CPUs, as trace-cmd saved them."""
    done = subprocess.run(
        ["trace-cmd", "report", "--stat", "-i", str(trace_dat)],
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(
        int(m.group(2))
        for m in re.finditer(r"^(overrun|commit overrun|dropped events): (\d+)$", done.stdout, re.M)
    )


def trace_cmd_record_argv(buffer_kb: int, output: Path, load: list[str]) -> list[str]:
    """`-k`: trace-cmd's own reset empties set_ftrace_filter while the function tracer is still
    on, so for a moment the kernel patches every function's call site; under QEMU's TCG that
    mass patching now and then livelocks the guest (vCPUs looping on a stale int3 at an fentry
    site). top_level_restored() switches the tracer off first, then clears the filter."""
    argv = ["trace-cmd", "record", "-k", "-F", "-c", "-b", str(buffer_kb), "-p", "function"]
    for function in FUNCTIONS:
        argv += ["-l", function]
    for event in TRACEPOINTS:
        argv += ["-e", event]
    return [*argv, "-o", str(output), *load]


def run_trace_cmd(work: Path, options: GuestOptions, level: int, rep: int) -> LiveRow:
    data = work / "trace.dat"
    report = work / "report.txt"
    load = load_argv(options.load, options.pairs, level, options.seconds)
    try:
        with top_level_restored():
            argv = trace_cmd_record_argv(options.buffer_kb, data, load)
            recorded = run_measured(argv, cwd=work)
        if recorded.returncode != 0 or not data.exists():
            raise RuntimeError(
                f"trace-cmd record failed ({recorded.returncode}):\n{recorded.stderr[-2000:]}"
            )
        load_run = parse_load(recorded.stdout, "trace-cmd record")
        reported = run_measured(["trace-cmd", "report", "-i", str(data)], stdout_path=report)
        if reported.returncode != 0:
            raise RuntimeError(f"trace-cmd report failed:\n{reported.stderr[-2000:]}")
        events, dropped, by_name = count_report(report)
        ring_lost = report_stat_lost(data)
    finally:
        data.unlink(missing_ok=True)
        report.unlink(missing_ok=True)
    return LiveRow(
        "trace-cmd",
        level,
        rep,
        load_run,
        events,
        max(dropped, ring_lost),
        ring_lost,
        recorded.cpu - load_run.cpu_seconds,
        recorded.wall,
        reported.cpu,
        reported.wall,
        by_event=by_name,
    )


# --------------------------------------------------------------------------------------------
# probescope


LOSS_LINE = re.compile(rb"^CPU:\S+ \[LOST (?:\S+ )?EVENTS\]$")


def count_output(path: Path) -> tuple[int, int]:
    """(event lines, loss lines) of a probescope text output."""
    events = losses = 0
    with path.open("rb") as stream:
        for line in stream:
            if LOSS_LINE.match(line.rstrip(b"\n")):
                losses += 1
            else:
                events += 1
    return events, losses


def probescope_argv(report: Path, output: Path, load: list[str], buffer_kb: int) -> list[str]:
    return [
        sys.executable, "-c", PROBESCOPE_RUNNER, str(report),
        "trace", *PROBESCOPE_SPECS, "-c", shlex.join(load), "-o", str(output),
        "--buffer-size", str(buffer_kb),
    ]  # fmt: skip


def run_probescope(
    work: Path, options: GuestOptions, level: int, rep: int, *, delay: float = 0.0
) -> LiveRow:
    output = work / "probescope.txt"
    report = work / "probescope.json"
    load = load_argv(options.load, options.pairs, level, options.seconds, delay)
    argv = probescope_argv(report, output, load, options.buffer_kb)
    try:
        done = run_measured(argv, cwd=PROJECT_ROOT)
        if done.returncode != 0 or not report.exists():
            raise RuntimeError(f"probescope failed ({done.returncode}):\n{done.stderr[-3000:]}")
        measured = json.loads(report.read_text())
        lines, losses = count_output(output)
    finally:
        output.unlink(missing_ok=True)
        report.unlink(missing_ok=True)
    load_run = parse_load(done.stdout, "probescope trace -c")
    marks = measured["marks"]
    (attached_cpu, attached_at), (closing_cpu, closing_at) = marks["attached"], marks["closing"]
    first_cpu, _ = marks.get("first_batch", (closing_cpu, closing_at))
    notes = [f"summary: {measured.get('reason')}", *measured.get("notes", [])]
    if lines != measured["events"]:
        notes.append(f"{lines} lines written for {measured['events']} events")
    if losses:
        notes.append(f"{losses} loss lines in the output")
    return LiveRow(
        "probescope-warm" if delay else "probescope",
        level,
        rep,
        load_run,
        measured["events"],
        measured["lost"],
        measured.get("ring_lost"),
        done.cpu - load_run.cpu_seconds,
        done.wall,
        closing_cpu - attached_cpu,
        closing_at - attached_at,
        steady_events=measured["events"] - marks.get("first_batch_events", 0),
        steady_cpu=closing_cpu - first_cpu,
        by_event={key.rpartition("/")[2]: n for key, n in measured.get("hits", {}).items()},
        note="; ".join(notes),
    )


def run_probescope_warm(work: Path, options: GuestOptions, level: int, rep: int) -> LiveRow:
    return run_probescope(work, options, level, rep, delay=options.warm_delay)


def profile_probescope(work: Path, load: list[str], buffer_kb: int) -> str:
    """cProfile of one more `probescope trace` run (not one of the measured runs)."""
    output, report, stats = (work / f"profiled.{s}" for s in ("txt", "json", "prof"))
    argv = probescope_argv(report, output, load, buffer_kb)
    try:
        done = run_measured(argv, cwd=PROJECT_ROOT, env={"PROBESCOPE_BENCH_PROFILE": str(stats)})
        if done.returncode != 0 or not stats.exists():
            raise RuntimeError(f"probescope failed ({done.returncode}):\n{done.stderr[-3000:]}")
        measured = json.loads(report.read_text())
        return (
            f"probescope trace ... -c '{shlex.join(load)}' under cProfile: "
            f"{measured.get('events')} events, lost {measured.get('lost')}\n"
            + profile_text(str(stats))
        )
    finally:
        for path in (output, report, stats):
            path.unlink(missing_ok=True)


def profile_text(source: str | cProfile.Profile, lines: int = 30) -> str:
    stream = io.StringIO()
    pstats.Stats(source, stream=stream).sort_stats("tottime").print_stats(lines)
    return "\n".join(line for line in stream.getvalue().splitlines() if line.strip())


# --------------------------------------------------------------------------------------------
# decode speed on identical input


def decode_identical(
    work: Path, load: list[str], options: GuestOptions, profiles: list[str]
) -> DecodeResult:
    from probescope.engines.tracefs.kernel_context import read_kernel_context
    from probescope.events import Event, EventBatch
    from probescope.language.model import ProbeKind
    from probescope.sinks.text import TextSink
    from probescope.system.kernel import RunningKernel
    from probescope.traceevent.decoder import EventDecoder
    from probescope.traceevent.format import (
        parse_event_format,
        parse_header_event,
        parse_header_page,
        parse_saved_cmdlines,
    )
    from probescope.traceevent.merge import merge_cpu_batches
    from probescope.traceevent.ringbuffer import SubBufferLayout, split_sub_buffers

    captured = capture(load, options.capture_kb)
    if captured.lost:
        raise RuntimeError(
            f"the capture lost {captured.lost} events: raise --capture-kb above "
            f"{options.capture_kb}"
        )
    layout = SubBufferLayout.from_header_page(
        parse_header_page(captured.header_page),
        header_event=parse_header_event(captured.header_event),
    )
    comms = parse_saved_cmdlines(captured.comms)
    sub_buffers = {cpu: list(split_sub_buffers(layout, data)) for cpu, data in captured.raw.items()}
    result = DecodeResult(captured.entries, sum(len(s) for s in sub_buffers.values()))
    # What `probescope trace` gives its sink: the guest kernel's symbols, BTF and strings.
    context = read_kernel_context(RunningKernel.read(), {ProbeKind.FUNCTION, ProbeKind.TRACEPOINT})

    def decoder() -> EventDecoder:
        decoder = EventDecoder(layout, comms=comms)
        for name, text in captured.formats.items():
            system = name.split("/")[0]
            kind = ProbeKind.FUNCTION if system == "ftrace" else ProbeKind.TRACEPOINT
            decoder.add_event(parse_event_format(text, system=system), kind=kind, group=system)
        return decoder

    def decode_events() -> int:
        decode = decoder().decode
        return sum(
            len(decode(sub_buffer, cpu).events)
            for cpu, buffers in sub_buffers.items()
            for sub_buffer in buffers
        )

    def text_decoding(stream: IO[bytes], *, prepared: bool = False) -> Callable[[], None]:
        """Decode everything into text lines on `stream`. `prepared`: the sink has printed
        one event of each type already, so its printers (kernel symbols, print fmts, BTF)
        are built before the returned function runs."""
        events_decoder = decoder()
        decode = events_decoder.decode
        sink = TextSink(stream, context=context, clock="local", lost_lines=False)
        if prepared:
            samples: dict[object, Event] = {}
            wanted = len(events_decoder.event_types)
            for cpu, buffers in sub_buffers.items():
                for sub_buffer in buffers:
                    for event in decode(sub_buffer, cpu).events:
                        samples.setdefault(event.type, event)
                    if len(samples) == wanted:
                        break
            for event in samples.values():
                sink.format(event)

        def run() -> None:
            streams = [map(decode, buffers, repeat(cpu)) for cpu, buffers in sub_buffers.items()]
            # Runs of one CPU are short when tasks ping-pong across CPUs; like the live
            # engine, hand the sink thousands of events at a time.
            pending: list[Event] = []
            for batch in merge_cpu_batches(streams):
                pending += batch.events
                if len(pending) >= SINK_BATCH:
                    sink.write_batch(EventBatch(pending))
                    pending = []
            sink.write_batch(EventBatch(pending))
            sink.close()

        return run

    def decode_text(stream: IO[bytes]) -> None:
        text_decoding(stream)()

    if options.profile:
        profiler = cProfile.Profile()
        with open(os.devnull, "wb") as null:
            profiler.runcall(decode_text, null)
        profiles.append(
            "probescope decoding the identical input to text under cProfile\n"
            + profile_text(profiler)
        )
    decoded = decode_events()
    if decoded != captured.entries:
        raise RuntimeError(f"decoded {decoded} events, the ring buffer held {captured.entries}")
    result.text_check = compare_text(decode_text, captured.trace_text)
    trace_dat = work / "restored.dat"
    result.skipped = restore_trace_dat(work, captured.raw, trace_dat) or ""
    report = work / "restored.txt"

    def report_once() -> float:
        done = run_measured(["trace-cmd", "report", "-i", str(trace_dat)], stdout_path=report)
        if done.returncode != 0:
            raise RuntimeError(f"trace-cmd report failed:\n{done.stderr[-2000:]}")
        return done.cpu

    def timed(function: Callable[[], object]) -> float:
        started = time.process_time()
        function()
        return time.process_time() - started

    try:
        for _ in range(options.decode_runs):
            result.probescope_events.append(timed(decode_events))
            with open(os.devnull, "wb") as null:
                result.probescope_text.append(timed(lambda: decode_text(null)))
                result.probescope_text_prepared.append(timed(text_decoding(null, prepared=True)))
            if not result.skipped:
                result.trace_cmd_report.append(report_once())
                result.report_events, _, _ = count_report(report)
    finally:
        report.unlink(missing_ok=True)
        trace_dat.unlink(missing_ok=True)
    return result


def compare_text(decode_text: Callable[[IO[bytes]], None], trace_text: bytes) -> str:
    stream = io.BytesIO()
    decode_text(stream)
    ours = stream.getvalue().split(b"\n")
    kernel = [line for line in trace_text.split(b"\n") if not line.startswith(b"#")]
    if ours == kernel:
        return f"identical to the instance's trace ({len(ours) - 1} lines)"
    differ = sum(a != b for a, b in zip(ours, kernel, strict=False))
    first = next((i for i, (a, b) in enumerate(zip(ours, kernel, strict=False)) if a != b), None)
    where = (
        f"; first at line {first}: {ours[first]!r} vs {kernel[first]!r}"
        if first is not None
        else ""
    )
    return (
        f"DIFFERS from the instance's trace: {differ} of {len(kernel)} lines differ, "
        f"{len(ours)} vs {len(kernel)} lines{where}"
    )


def restore_trace_dat(work: Path, raw: dict[int, bytes], trace_dat: Path) -> str | None:
    """trace.dat from the captured sub-buffers: `restore -c` writes this system's headers and
    formats, `restore -i` appends one raw file per CPU. None when it worked, else why not."""
    header = work / "header.dat"
    files = []
    for cpu in sorted(raw):
        path = work / f"cpu{cpu}.raw"
        path.write_bytes(raw[cpu])
        files.append(str(path))
    steps = [
        ["trace-cmd", "restore", "-c", "-o", str(header)],
        ["trace-cmd", "restore", "-i", str(header), "-o", str(trace_dat), *files],
    ]
    try:
        for step, made in zip(steps, (header, trace_dat), strict=True):
            done = subprocess.run(step, capture_output=True, text=True, cwd=work)
            if done.returncode != 0 or not made.exists():
                return f"{' '.join(step[:3])} failed: {done.stderr.strip()[-300:]}"
    finally:
        header.unlink(missing_ok=True)
        for name in files:
            Path(name).unlink(missing_ok=True)
    return None


# --------------------------------------------------------------------------------------------
# the guest part


@dataclass(frozen=True)
class GuestOptions:
    out: Path
    load: Path
    pairs: int
    seconds: float
    levels: tuple[int, ...]
    reps: int
    buffer_kb: int
    capture_seconds: float
    capture_kb: int
    decode_runs: int
    warm_delay: float
    profile: bool


def check_guest() -> None:
    if os.geteuid() != 0:
        raise Unavailable("the guest part must run as root")
    try:
        with open(TRACEFS / "available_filter_functions", "rb") as functions:
            functions.read(1)
    except OSError as error:
        raise Unavailable(f"this kernel refuses the function tracer ({error.strerror})") from None
    if shutil.which("trace-cmd") is None:
        raise Unavailable("trace-cmd is not installed (apt-get install trace-cmd on the host)")


def inside_guest(options: GuestOptions) -> Results:
    check_guest()
    results = Results(
        kernel=os.uname().release,
        cpus=os.cpu_count() or 1,
        pairs=options.pairs,
        seconds=options.seconds,
        buffer_kb=options.buffer_kb,
        levels=list(options.levels),
        reps=options.reps,
        warm_delay=options.warm_delay,
    )
    started = time.monotonic()
    tools: list[tuple[str, Callable[[Path, GuestOptions, int, int], LiveRow]]] = [
        ("trace-cmd", run_trace_cmd),
        ("probescope", run_probescope),
    ]
    if options.warm_delay:
        tools.append(("probescope-warm", run_probescope_warm))
    with tempfile.TemporaryDirectory(prefix="probescope-bench-static-") as scratch:
        work = Path(scratch)
        for rep in range(options.reps):
            for index, level in enumerate(options.levels):
                order = tools if (rep + index) % 2 == 0 else tools[::-1]
                for name, tool in order:
                    progress(f"rep {rep + 1}/{options.reps}, rate {level or 'flat out'}: {name}")
                    try:
                        results.live.append(tool(work, options, level, rep))
                    except RuntimeError as error:
                        results.errors.append(f"{name} at rate {level}, rep {rep + 1}: {error}")
                    left = probescope_leftovers()
                    if left:
                        results.errors.append(f"left in tracefs after {name}: {left}")
        if options.profile:
            for level in options.levels:
                progress(f"profiling probescope at rate {level or 'flat out'}")
                load = load_argv(options.load, options.pairs, level, options.seconds)
                try:
                    results.profiles.append(profile_probescope(work, load, options.buffer_kb))
                except RuntimeError as error:
                    results.errors.append(f"profiling at rate {level}: {error}")
        if options.decode_runs:
            progress("decode of identical sub-buffers")
            load = load_argv(options.load, options.pairs, 0, options.capture_seconds)
            try:
                results.decode = decode_identical(work, load, options, results.profiles)
            except RuntimeError as error:
                results.errors.append(f"decode of identical input: {error}")
    results.wall = time.monotonic() - started
    return results


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# the host part


def host_main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(PROJECT_ROOT / "tests"))
    from vm.guest import GuestKernel
    from vm.guest_errors import GuestError, GuestUnavailable

    started = time.monotonic()
    guest = GuestKernel(command_timeout=GUEST_TIMEOUT)
    try:
        try:
            guest.prepare()
        except GuestUnavailable as error:
            hint = f" ({error.hint})" if error.hint else ""
            print(
                f"bench_static.py: no test VM, nothing measured: {error.message}{hint}",
                file=sys.stderr,
            )
            return 3
        print("booting the test VM...", file=sys.stderr, flush=True)
        guest.start()
        load = guest.shared_dir / "static_load"
        source = load.with_suffix(".c")
        source.write_text(LOAD_SOURCE)
        subprocess.run(["gcc", "-O2", "-Wall", "-o", str(load), str(source)], check=True)
        out = guest.shared_dir / "results.json"
        argv = [
            sys.executable, str(Path(__file__).resolve()), "--inside-guest",
            "--out", str(out), "--load", str(load),
            "--pairs", str(args.pairs), "--seconds", str(args.seconds),
            "--levels", args.levels, "--reps", str(args.reps),
            "--buffer-kb", str(args.buffer_kb), "--capture-seconds", str(args.capture_seconds),
            "--capture-kb", str(args.capture_kb), "--decode-runs", str(args.decode_runs),
            "--warm-delay", str(args.warm_delay),
        ]  # fmt: skip
        if args.profile:
            argv.append("--profile")
        print(
            f"guest {guest.release} up ({guest.accel}, {guest.boot_seconds:.1f} s); measuring...",
            file=sys.stderr,
            flush=True,
        )
        env = {"PYTHONDONTWRITEBYTECODE": "1"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        done = guest.run(shlex.join(argv), cwd=str(PROJECT_ROOT), timeout=GUEST_TIMEOUT, env=env)
        sys.stderr.write(done.stderr)
        if done.returncode != 0 or not out.exists():
            print(
                f"the guest part failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                f"console:\n{done.console_log[-3000:]}",
                file=sys.stderr,
            )
            return 1
        results = Results.from_json(json.loads(out.read_text()))
        release, accel = guest.release, guest.accel
    except GuestError as error:
        print(f"bench_static.py: the test VM failed: {error}", file=sys.stderr)
        return 1
    finally:
        guest.close()
    print_results(results, release, accel, time.monotonic() - started)
    return 0


LIVE_LEGEND = """
  events: recorded (trace-cmd: lines of its report; probescope: events written). fn/round:
  function events per load round trip (4 = 2 vfs_write + 2 vfs_read when none is lost; the
  sched events vary with where the scheduler puts the pairs). lost: the tool's own count
  (trace-cmd: ring-buffer overrun and drops it saved, and EVENTS DROPPED markers; probescope:
  its session summary); ring lost: the kernel's ring-buffer counters alone. record CPU s: the
  recording process(es) from start to exit, the load's own CPU taken out. decode CPU s:
  trace-cmd report, or probescope's streaming loop from attach to detach (reading the ring
  buffer, decoding, writing text). decoded ev/s = events / decode CPU s; steady ev/s: the same
  after probescope's first batch, whose printers load kernel symbols and print fmts.
  probescope-warm: the load starts {delay:g} s after attach, so that this one-time set-up is
  over before the load begins (a diagnostic: with -c the first events come from the exec)."""


def print_live(tool: str, rows: list[LiveRow]) -> None:
    ring = [r.ring_lost for r in rows if r.ring_lost is not None]
    steady = [rate for r in rows if (rate := r.steady_rate) is not None]
    print(
        f"  {tool:15} {median([r.load.rate for r in rows]):8,.0f} "
        f"{median([r.events for r in rows]):8,.0f} "
        f"{median([r.by_event.get('function', 0) / max(r.load.rounds, 1) for r in rows]):8.3f} "
        f"{median([r.lost for r in rows]):7,.0f} "
        f"{median(ring) if ring else float('nan'):9,.0f} "
        f"{median([r.record_cpu for r in rows]):12.2f} "
        f"{median([r.decode_cpu for r in rows]):12.2f} "
        f"{median([r.decode_rate for r in rows]):12,.0f} "
        + (f"{median(steady):11,.0f}" if steady else f"{'':11}")
    )
    for row in rows:
        print(
            f"      run {row.rep + 1}: {row.load.rounds:,} rounds, {row.events:,} events, "
            f"lost {row.lost:,}, decode CPU {row.decode_cpu:.2f} s; "
            + ", ".join(f"{name} {n:,}" for name, n in sorted(row.by_event.items()))
            + (f" ({row.note})" if row.note else "")
        )


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def print_results(results: Results, release: str, accel: str, total: float) -> None:
    print(
        f"guest kernel {release} ({accel}, {results.cpus} CPUs); host kernel {os.uname().release};"
        f" {total:.0f} s in all, {results.wall:.0f} s measuring"
    )
    print(
        f"load: {results.pairs} pipe ping-pong pairs for {results.seconds:g} s per run; traced: "
        f"{', '.join(f'function {f}' for f in FUNCTIONS)}, {', '.join(TRACEPOINTS)}; the load "
        f"and its children only; {results.buffer_kb} KB buffer per CPU; medians of "
        f"{results.reps} runs"
    )
    header = (
        f"  {'tool':15} {'rounds/s':>8} {'events':>8} {'fn/round':>8} {'lost':>7} {'ring lost':>9}"
        f" {'record CPU s':>12} {'decode CPU s':>12} {'decoded ev/s':>12} {'steady ev/s':>11}"
    )
    verdicts: list[str] = []
    for level in results.levels:
        title = "flat out" if level == 0 else f"paced at {level:,} round trips/s"
        print(f"\nload {title}")
        print(header)
        rows = {
            tool: [r for r in results.live if r.level == level and r.tool == tool]
            for tool in ("trace-cmd", "probescope", "probescope-warm")
        }
        for tool, tool_rows in rows.items():
            if tool_rows:
                print_live(tool, tool_rows)
        peer, ours, warm = rows["trace-cmd"], rows["probescope"], rows["probescope-warm"]
        if peer and ours:
            ratio = median([r.decode_rate for r in ours]) / median([r.decode_rate for r in peer])
            peer_lossless = all(r.lost == 0 for r in peer)
            loss = (
                f"trace-cmd lost nothing, probescope lost up to {max(r.lost for r in ours):,} "
                f"({'holds' if all(r.lost == 0 for r in ours) else 'MISSES'} zero loss)"
                if peer_lossless
                else "trace-cmd itself lost events here (no loss target at this load)"
            )
            if warm:
                loss += (
                    f"; with its set-up done before the load: up to {max(r.lost for r in warm):,}"
                )
            steady = [rate for r in ours if (rate := r.steady_rate) is not None]
            steady_ratio = median(steady) / median([r.decode_rate for r in peer])
            verdicts.append(
                f"{title}: decode ratio {ratio:.2f} "
                f"({'holds' if ratio >= 0.5 else 'MISSES'} >= 0.5; {steady_ratio:.2f} after the "
                f"first batch); {loss}"
            )
    print(LIVE_LEGEND.format(delay=results.warm_delay))
    decode = results.decode
    if decode is not None:
        print(
            f"\ndecode of identical input: {decode.events:,} events in {decode.sub_buffers:,} "
            f"sub-buffers (flat-out load traced into a private instance), CPU seconds, median of "
            f"{len(decode.probescope_events)}"
        )
        report_rate = (
            decode.events / median(decode.trace_cmd_report) if decode.trace_cmd_report else 0.0
        )
        for name, seconds in (
            ("probescope: decode to Events", decode.probescope_events),
            ("probescope: decode to text lines", decode.probescope_text),
            ("  the same, printers built beforehand", decode.probescope_text_prepared),
            ("trace-cmd report (restored trace.dat)", decode.trace_cmd_report),
        ):
            if not seconds:
                print(f"  {name:40} skipped: {decode.skipped}")
                continue
            rate = decode.events / median(seconds)
            versus = f"{rate / report_rate:6.2f}x trace-cmd" if report_rate else ""
            print(f"  {name:40} {median(seconds):7.2f} s {rate:12,.0f} ev/s  {versus}")
        if decode.trace_cmd_report and decode.report_events != decode.events:
            print(f"  note: trace-cmd report printed {decode.report_events:,} events")
        print(f"  probescope's text: {decode.text_check}")
        if report_rate and decode.probescope_text:
            ratio = decode.events / median(decode.probescope_text) / report_rate
            verdicts.append(
                f"identical input: text decode ratio {ratio:.2f} "
                f"({'holds' if ratio >= 0.5 else 'MISSES'} >= 0.5)"
            )
    for profile in results.profiles:
        print(f"\n{profile}")
    for error in results.errors:
        print(f"\nERROR: {error}")
    print("\ntargets (zero loss where trace-cmd loses none; decode within 2x of trace-cmd report):")
    for verdict in verdicts:
        print(f"  {verdict}")


# --------------------------------------------------------------------------------------------
# command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--levels",
        default="2000,0",
        help="load rates in round trips/s, comma-separated (0: flat out)",
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions per level")
    parser.add_argument("--pairs", type=int, default=2, help="ping-pong process pairs")
    parser.add_argument("--seconds", type=float, default=3.0, help="load duration per run")
    parser.add_argument(
        "--buffer-kb",
        type=int,
        default=1408,
        help="ring buffer per CPU for both tools (the kernel's default)",
    )
    parser.add_argument(
        "--capture-seconds",
        type=float,
        default=1.5,
        help="flat-out load traced for the identical-input decode",
    )
    parser.add_argument(
        "--capture-kb",
        type=int,
        default=32768,
        help="ring buffer per CPU of that capture (must hold it all)",
    )
    parser.add_argument(
        "--decode-runs",
        type=int,
        default=3,
        help="runs of each decoder on identical input (0: skip)",
    )
    parser.add_argument(
        "--warm-delay",
        type=float,
        default=8.0,
        help="also run probescope with the load starting this many seconds after attach, so "
        "its one-time set-up is done before the load (0: skip that run)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also run probescope under cProfile (extra runs) and print where its time goes",
    )
    parser.add_argument("--inside-guest", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--load", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.inside_guest:
        return host_main(args)
    options = GuestOptions(
        out=args.out,
        load=args.load,
        pairs=args.pairs,
        seconds=args.seconds,
        levels=tuple(int(level) for level in args.levels.split(",") if level.strip()),
        reps=args.reps,
        buffer_kb=args.buffer_kb,
        capture_seconds=args.capture_seconds,
        capture_kb=args.capture_kb,
        decode_runs=args.decode_runs,
        warm_delay=args.warm_delay,
        profile=args.profile,
    )
    try:
        results = inside_guest(options)
    except Unavailable as reason:
        print(f"bench_static.py (guest): {reason}", file=sys.stderr)
        return 3
    args.out.write_text(json.dumps(asdict(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
