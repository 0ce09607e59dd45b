"""Benchmark of the tracefs engine, probescope vs its peers, in one run.

Run as root: `.venv/bin/python bench/bench_tracefs.py [--parts a,b,c] [--runs R] ...`.
Each part is a function in PARTS returning rows; `main` runs every part asked for (default: all)
and prints one table per part with medians and the ratio of probescope to its peers.

(a) cost per probe hit in the traced program. A C target calls `probed()` N times in a tight
    loop and times the loop itself (clock_gettime), so what is measured is the traced program's
    cost per call, never a tool's start-up. Two builds of one source: -O0 with a frame pointer
    (`probed` starts with `push %rbp`, which the kernel emulates) and -O2 (`lea`, which the
    kernel single-steps out of line). In every repetition each consumer runs once, interleaved,
    with the target pinned to --cpu and the tools to the other CPUs:
      - no probe;
      - the same uprobe written by hand into a private instance, nobody reading (the floor);
      - hand + the baseline reader: a small C program doing O_NONBLOCK read(2) of whole
        sub-buffers from every CPU's trace_pipe_raw and poll(2) between rounds, so it sleeps
        until `buffer_percent` of a buffer is full — the cheapest consumer there is, and the
        wake-up policy probescope uses. `cat per_cpu/cpuN/trace_pipe_raw` cannot serve: it
        exits at the first 0-byte read, which the kernel returns while the writer is on the
        reader page;
      - hand + a blocking reader (blocking read(2) per CPU, what `cat` does): the kernel then
        wakes the reader for nearly every event, which costs the traced program;
      - the baseline reader with the instance set up as probescope sets its own (mono trace
        clock, record-tgid, set_event_pid with event-fork): the kernel-side cost of those;
      - a control: the baseline reader plus a busy loop on the tools' CPU, i.e. what any
        CPU-bound consumer costs the traced program on this machine, whatever it does;
      - probescope: `probescope trace SPEC -c CMD -o FILE`;
      - `perf record` of the same uprobe defined with `perf probe`;
      - bpftrace counting hits in the kernel (`@ = count()`).
    Ratios are extra ns per hit (over no probe) divided by the baseline reader's.
(b) ring-buffer decode. A C target calls a uprobed function N times (an int and a string
    argument), pinned to one CPU, into a private instance whose buffer holds all N events. Then,
    on those same events: `cat trace` (the kernel's text, non-consuming), the raw read of
    `per_cpu/cpuN/trace_pipe_raw` (os.read of whole sub-buffers, consuming), probescope
    decoding the saved sub-buffers into Event objects and into kernel-identical text lines
    (checked byte for byte against `cat trace`), and `trace-cmd report` on a trace.dat built from
    the very same sub-buffers with `trace-cmd restore` (`trace-cmd record` cannot run here: it
    writes `ftrace_enabled`). The kernel's `trace_pipe` consumes, so for it the target runs again
    per measurement and `head -n N trace_pipe` is timed until all N events are read.
(c) sustained load. The -O0 target paces itself at --rate calls/s for --load-seconds (bursts
    every millisecond) and prints how many calls it made. Consumers, one after the other:
    the baseline reader writing the raw sub-buffers to a file; `probescope trace ... -o FILE` in
    text and in jsonl (and, if it lost events, again with larger --buffer-size until nothing is
    lost); `perf record`; `trace-cmd record` (reported as skipped when the kernel refuses it).
    Events received are counted in the output (lines, perf samples, the instance's `read
    events`) and compared with calls made; peak RSS and CPU time come from wait4(2) on the
    consumer in a small C launcher (RUSAGE_SOURCE), minus the target's own CPU time where the
    target is the consumer's child.
Outputs go to /dev/shm. Everything created in tracefs is named `probescope[-_]bench[-_]<pid>`
and removed on every exit path.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from probescope.sinks.text import TextSink
from probescope.traceevent.context import KernelContext
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.format import (
    parse_event_format,
    parse_header_event,
    parse_header_page,
    parse_saved_cmdlines,
)
from probescope.traceevent.ringbuffer import SubBufferLayout, split_sub_buffers

TRACEFS = Path("/sys/kernel/tracing")
SCRATCH_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None

LOOP_SOURCE = r"""
#include <stdlib.h>
__attribute__((noinline)) int probed(int n, const char *s)
{
    __asm__ volatile("" ::: "memory");
    return n + s[0];
}
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int acc = 0;
    for (long i = 0; i < n; i++)
        acc += probed((int)i, "hello world");
    return acc == 42;
}
"""

# The traced program of parts (a) and (c). `loop N`: N calls back to back, timed by the program;
# `paced RATE SECONDS`: every millisecond, as many calls as keep the total at RATE per second;
# `spin`: a busy loop (the CPU-bound neighbour of the control measurement).
TARGET_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

__attribute__((noinline)) int probed(int n)
{
    __asm__ volatile("" ::: "memory");
    return n + 1;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv)
{
    volatile int sink = 0;
    if (argc == 3 && strcmp(argv[1], "loop") == 0) {
        long n = atol(argv[2]);
        double start = now();
        for (long i = 0; i < n; i++)
            sink += probed((int)i);
        double elapsed = now() - start;
        printf("calls=%ld ns_per_call=%.3f cpu_s=%.6f\n", n, elapsed * 1e9 / n, cpu_seconds());
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "paced") == 0) {
        double rate = atof(argv[2]), seconds = atof(argv[3]), start = now(), elapsed;
        struct timespec pause = {0, 1000000};
        long made = 0;
        while ((elapsed = now() - start) < seconds) {
            long due = (long)(rate * elapsed);
            while (made < due)
                sink += probed((int)made++);
            nanosleep(&pause, NULL);
        }
        printf("calls=%ld seconds=%.3f cpu_s=%.6f\n", made, elapsed, cpu_seconds());
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "spin") == 0)
        for (;;)
            sink++;
    fprintf(stderr, "usage: %s loop N | paced RATE SECONDS | spin\n", argv[0]);
    return 2;
}
"""

# The baseline consumer: `reader poll|block OUT TRACE_PIPE_RAW...`. poll: O_NONBLOCK reads of
# every file until EAGAIN, then poll(2) (the kernel wakes it at buffer_percent) with a 100 ms
# timeout. block: blocking reads (give one file). SIGTERM: drain what is left and exit; prints
# the bytes copied on stderr.
READER_SOURCE = r"""
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;
static void stop(int sig) { (void)sig; stopping = 1; }
static char page[1 << 20];

static int copy(int fd, int out, long long *bytes)
{
    ssize_t n = read(fd, page, sizeof page);
    if (n > 0) {
        *bytes += n;
        if (write(out, page, n) != n)
            return -2;
    }
    return (int)(n > 0 ? 1 : n);
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc - 3 > 512)
        return 2;
    int blocking = strcmp(argv[1], "block") == 0, n = argc - 3;
    int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    struct pollfd fds[512];
    struct sigaction action;
    long long bytes = 0;
    memset(&action, 0, sizeof action);
    action.sa_handler = stop;
    sigaction(SIGTERM, &action, NULL);
    for (int i = 0; i < n; i++) {
        fds[i].fd = open(argv[i + 3], O_RDONLY | (blocking ? 0 : O_NONBLOCK));
        fds[i].events = POLLIN;
        if (fds[i].fd < 0 || out < 0) {
            perror(argv[i + 3]);
            return 1;
        }
    }
    while (!stopping) {
        if (blocking) {
            if (copy(fds[0].fd, out, &bytes) == -2)
                return 1;
            continue;
        }
        int got = 0, r;
        for (int i = 0; i < n; i++)
            while ((r = copy(fds[i].fd, out, &bytes)) == 1)
                got = 1;
        if (!got)
            poll(fds, n, 100);
    }
    for (int i = 0; i < n; i++) {
        fcntl(fds[i].fd, F_SETFL, O_NONBLOCK);
        while (copy(fds[i].fd, out, &bytes) == 1)
            ;
    }
    fprintf(stderr, "bytes=%lld\n", bytes);
    return 0;
}
"""

# `rusage REPORT PROGRAM ARGS...`: run PROGRAM, pass SIGTERM/SIGINT on to it, then write its exit
# status, peak RSS and CPU time (its own plus its waited-for children's) to REPORT. wait4(2) from
# Python would not do: a child's ru_maxrss keeps the RSS of the mm it had before exec, i.e. a copy
# of the benchmark process itself, which holds a million events after part (b).
RUSAGE_SOURCE = r"""
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t child;
static void forward(int sig) { if (child > 0) kill(child, sig); }

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = forward;
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
    child = fork();
    if (child == 0) {
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status;
    struct rusage u;
    while (wait4(child, &status, 0, &u) < 0)
        if (errno != EINTR)
            return 1;
    FILE *report = fopen(argv[1], "w");
    if (report == NULL)
        return 1;
    fprintf(report, "status=%d maxrss_kb=%ld cpu_s=%.6f\n",
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), u.ru_maxrss,
            u.ru_utime.tv_sec + u.ru_stime.tv_sec
                + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6);
    return fclose(report) != 0;
}
"""

FETCHARGS = "n=%di:s32"
TARGET_LINE = re.compile(r"calls=(\d+) (?:ns_per_call=([\d.]+)|seconds=([\d.]+)) cpu_s=([\d.]+)")


@dataclass
class Result:
    part: str
    name: str
    events: int
    seconds: list[float]
    probescope: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.events / self.median


@dataclass(frozen=True)
class Options:
    events: int
    runs: int
    cpu: int
    keep: Path | None
    cost_runs: int = 5
    hits: int = 300_000
    stepped_hits: int = 30_000
    rate: int = 300_000
    load_seconds: float = 10.0
    load_buffers_kb: tuple[int, ...] = (16_384, 65_536)


class Unavailable(Exception):
    """A peer cannot run here; the reason is printed in its row."""


# --------------------------------------------------------------------------------------------
# tracefs plumbing (self-contained: the benchmark must not depend on the code it measures for
# setting up, only for decoding)


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def _retry_busy(action: Callable[[], None], attempts: int = 50) -> None:
    for attempt in range(attempts):
        try:
            action()
            return
        except OSError as error:
            if error.errno != errno.EBUSY or attempt == attempts - 1:
                raise
            time.sleep(0.1)


@dataclass(frozen=True)
class Counters:
    """Sums over CPUs of an instance's `per_cpu/cpuN/stats`."""

    entries: int = 0
    read: int = 0
    lost: int = 0  # overrun + commit overrun + dropped events

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.entries, self.read - other.read, self.lost - other.lost)


@dataclass(frozen=True)
class Hand:
    """A private instance and a group of uprobes defined by hand, as a user would with echo."""

    root: Path
    group: str

    def enable(self, event: str, on: bool = True) -> None:
        _write(self.root / "events" / self.group / event / "enable", "1" if on else "0")

    def clear(self) -> None:
        """Empty the buffer (and reset its counters): open `trace` with O_TRUNC."""
        os.close(os.open(self.root / "trace", os.O_WRONLY | os.O_TRUNC))

    def pipes(self) -> list[Path]:
        per_cpu = self.root / "per_cpu"
        return sorted(per_cpu.glob("cpu*/trace_pipe_raw"), key=lambda p: int(p.parent.name[3:]))

    def counters(self) -> Counters:
        entries = read = lost = 0
        for stats in (self.root / "per_cpu").glob("cpu*/stats"):
            values = {}
            for line in stats.read_text().splitlines():
                key, _, value = line.partition(":")
                if value.strip().isdigit():
                    values[key.strip()] = int(value)
            entries += values.get("entries", 0)
            read += values.get("read events", 0)
            lost += sum(values.get(k, 0) for k in ("overrun", "commit overrun", "dropped events"))
        return Counters(entries, read, lost)


@contextmanager
def hand_instance(events: dict[str, str], buffer_kb: int | None = None) -> Iterator[Hand]:
    """Instance `probescope-bench-<pid>` and uprobes `probescope_bench_<pid>/EVENT LOCATION`,
    none enabled; on exit every event is disabled, the instance removed, the events removed."""
    pid = os.getpid()
    hand = Hand(TRACEFS / "instances" / f"probescope-bench-{pid}", f"probescope_bench_{pid}")
    defined: list[str] = []
    os.mkdir(hand.root)
    try:
        if buffer_kb:
            _write(hand.root / "buffer_size_kb", str(buffer_kb))
        for event, location in events.items():
            _append(TRACEFS / "uprobe_events", f"p:{hand.group}/{event} {location}")
            defined.append(event)
        yield hand
    finally:
        left: list[str] = []
        for event in defined:
            try:
                hand.enable(event, False)
            except OSError:
                pass
        try:
            _retry_busy(lambda: os.rmdir(hand.root))
        except OSError as error:
            left.append(f"instance {hand.root.name} ({error.strerror})")
        for event in defined:
            try:
                _retry_busy(partial(_append, TRACEFS / "uprobe_events", f"-:{hand.group}/{event}"))
            except OSError as error:
                left.append(f"event {hand.group}/{event} ({error.strerror})")
        if left:
            print(f"warning: could not remove from tracefs: {', '.join(left)}", file=sys.stderr)


@contextmanager
def probed_instance(binary: Path, offset: int, buffer_kb: int) -> Iterator[tuple[Path, str]]:
    """An instance with one enabled-on-demand uprobe `hit`; everything removed on exit."""
    location = f"{binary}:0x{offset:x} n=%di:s32 s=+0(%si):string"
    with hand_instance({"hit": location}, buffer_kb) as hand:
        yield hand.root, hand.group


# --------------------------------------------------------------------------------------------
# programs


def compile_c(source: str, binary: Path, *flags: str) -> Path:
    source_path = binary.with_suffix(".c")
    source_path.write_text(source)
    subprocess.run(["gcc", *flags, "-o", str(binary), str(source_path)], check=True)
    return binary


def symbol_offset(binary: Path, name: str) -> int:
    """File offset of function `name`: what a uprobe definition takes."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with binary.open("rb") as stream:
        elf = ELFFile(stream)
        symtab = elf.get_section_by_name(".symtab")
        if not isinstance(symtab, SymbolTableSection):
            raise RuntimeError(f"{binary} has no .symtab")
        symbols = symtab.get_symbol_by_name(name)
        if not symbols:
            raise RuntimeError(f"{binary} has no symbol {name!r}")
        symbol = symbols[0]
        value = symbol["st_value"]
        for segment in elf.iter_segments("PT_LOAD"):
            start = segment["p_vaddr"]
            if start <= value < start + segment["p_filesz"]:
                return int(value - start + segment["p_offset"])
    raise RuntimeError(f"{name}() is not in a PT_LOAD segment of {binary}")


def first_instruction(binary: Path, offset: int) -> str:
    import capstone  # type: ignore[import-untyped]

    code = binary.read_bytes()[offset : offset + 16]
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    for instruction in disassembler.disasm(code, offset):
        return f"{instruction.mnemonic} {instruction.op_str}".strip()
    raise RuntimeError(f"no instruction at {binary}:0x{offset:x}")


def build(directory: Path) -> tuple[Path, int]:
    binary = compile_c(LOOP_SOURCE, directory / "probescope-bench-loop", "-O0")
    return binary, symbol_offset(binary, "probed")


@dataclass(frozen=True)
class Variant:
    """One build of TARGET_SOURCE and how the kernel handles its probed instruction."""

    key: str
    binary: Path
    offset: int
    instruction: str
    handling: str
    hits: int

    @property
    def spec(self) -> str:
        return f"{self.binary}:probed {FETCHARGS}"

    @property
    def location(self) -> str:
        return f"{self.binary}:0x{self.offset:x} {FETCHARGS}"


def build_variants(directory: Path, options: Options) -> list[Variant]:
    variants = []
    builds = [
        ("emulated", ("-O0", "-fno-omit-frame-pointer"), "push", options.hits),
        ("stepped", ("-O2", "-fcf-protection=none"), None, options.stepped_hits),
    ]
    for key, flags, expected, hits in builds:
        binary = compile_c(TARGET_SOURCE, directory / f"probescope-bench-{key}", *flags)
        offset = symbol_offset(binary, "probed")
        instruction = first_instruction(binary, offset)
        mnemonic = instruction.split()[0]
        emulated = mnemonic in ("push", "nop", "jmp", "call") or mnemonic.startswith("j")
        if (expected is not None and mnemonic != expected) or (expected is None and emulated):
            raise RuntimeError(
                f"gcc {' '.join(flags)} made probed() start with {instruction!r}: "
                "the build no longer shows the case it is meant to"
            )
        handling = "emulated by the kernel" if emulated else "single-stepped out of line"
        variants.append(Variant(key, binary, offset, instruction, handling, hits))
    return variants


@dataclass(frozen=True)
class TargetReport:
    calls: int
    ns_per_call: float
    seconds: float
    cpu_seconds: float


def parse_target(output: str, what: str) -> TargetReport:
    match = TARGET_LINE.search(output)
    if match is None:
        raise RuntimeError(f"{what}: no report from the target in its output:\n{output[-2000:]}")
    calls, ns, seconds, cpu = match.groups()
    return TargetReport(
        int(calls),
        float(ns) if ns else 0.0,
        float(seconds) if seconds else 0.0,
        float(cpu),
    )


# Lines a sink writes for a loss rather than an event: the kernel's `CPU:N [LOST M EVENTS]`
# (text; probescope writes `CPU:?` when a batch merged CPUs) and `{"lost": M, "cpu": N}` (jsonl).
LOSS_LINE = re.compile(rb'CPU:\S+ \[LOST \S+ EVENTS\]$|\{"lost":')


def count_events(path: Path) -> int:
    """Event lines in a probescope output file."""
    count = 0
    with path.open("rb") as stream:
        for line in stream:
            if not LOSS_LINE.match(line):
                count += 1
    return count


def cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


@contextmanager
def perf_probes(variants: Sequence[Variant]) -> Iterator[tuple[str, str | None]]:
    """The same uprobes defined with `perf probe` in group `probescope_bench_<pid>_perf`, one
    event per variant key; yields (group, reason perf cannot be used or None)."""
    group = f"probescope_bench_{os.getpid()}_perf"
    defined = False
    reason = None
    try:
        if shutil.which("perf") is None:
            reason = "perf is not installed"
        else:
            for variant in variants:
                done = subprocess.run(
                    [
                        "perf",
                        "probe",
                        "-x",
                        str(variant.binary),
                        "-a",
                        f"{group}:{perf_event(variant)}=probed {FETCHARGS}",
                    ],
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    reason = f"perf probe failed: {done.stderr.strip()[-200:]}"
                    break
                defined = True
        yield group, reason
    finally:
        if defined:
            done = subprocess.run(
                ["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True, text=True
            )
            if done.returncode != 0:
                print(f"warning: perf probe -d {group}:* failed: {done.stderr}", file=sys.stderr)


def perf_event(variant: Variant) -> str:
    """perf probe refuses an event name that any group already uses (the hand-made ones)."""
    return f"perf_{variant.key}"


def perf_samples(data: Path, event: str) -> int:
    """Samples of `event` in a perf.data file."""
    done = subprocess.run(
        ["perf", "report", "--stats", "-i", str(data)], capture_output=True, text=True
    )
    match = re.search(rf"{re.escape(event)} stats:\s+SAMPLE events:\s+(\d+)", done.stdout)
    if match is None:
        raise RuntimeError(f"perf report --stats shows no {event} samples:\n{done.stdout}")
    return int(match.group(1))


def probescope_command(spec: str, command: list[str], output: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "probescope", "trace", spec,
        "-c", shlex.join(command), "-o", str(output), *extra,
    ]  # fmt: skip


SUMMARY_LOST = re.compile(r"probescope: (\d+) events .*; lost (\d+)")


def probescope_summary(stderr: str) -> tuple[int, int]:
    """(events, lost) from probescope's summary on stderr."""
    match = SUMMARY_LOST.search(stderr)
    if match is None:
        raise RuntimeError(f"probescope printed no summary:\n{stderr[-2000:]}")
    return int(match.group(1)), int(match.group(2))


def fill(instance: Path, group: str, binary: Path, options: Options) -> None:
    """Run the target once with the uprobe enabled: N events on `options.cpu`."""
    enable = instance / "events" / group / "hit" / "enable"
    _write(enable, "1")
    try:
        subprocess.run(
            ["taskset", "-c", str(options.cpu), str(binary), str(options.events)], check=True
        )
    finally:
        _write(enable, "0")
    stats = (instance / "per_cpu" / f"cpu{options.cpu}" / "stats").read_text()
    entries = int(stats.split("entries:")[1].split()[0])
    if entries != options.events:
        raise RuntimeError(f"buffer holds {entries} events, expected {options.events}:\n{stats}")


def read_raw(path: Path, size: int) -> tuple[bytes, float]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    started = time.perf_counter()
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
    return b"".join(chunks), time.perf_counter() - started


def timed(function: Callable[[], object], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


# --------------------------------------------------------------------------------------------
# part (b): decoding the ring buffer


def part_b_decode(options: Options) -> list[Result]:
    results: list[Result] = []
    n = options.events
    work = Path(tempfile.mkdtemp(prefix="probescope-bench-"))
    try:
        binary, offset = build(work)
        buffer_kb = max(1024, n * 48 // 1024)
        with probed_instance(binary, offset, buffer_kb) as (instance, group):
            fill(instance, group, binary, options)
            events_dir = instance / "events"
            header_page = (events_dir / "header_page").read_text()
            header_event = (events_dir / "header_event").read_text()
            format_text = (events_dir / group / "hit" / "format").read_text()

            trace_seconds = timed(
                lambda: subprocess.run(
                    ["cat", str(instance / "trace")], stdout=subprocess.DEVNULL, check=True
                ),
                options.runs,
            )
            results.append(Result("b", "kernel: cat trace", n, trace_seconds))
            trace_text = (instance / "trace").read_bytes()
            comms = parse_saved_cmdlines((TRACEFS / "saved_cmdlines").read_bytes())

            layout = SubBufferLayout.from_header_page(
                parse_header_page(header_page), header_event=parse_header_event(header_event)
            )
            raw, raw_seconds = read_raw(
                instance / "per_cpu" / f"cpu{options.cpu}" / "trace_pipe_raw", layout.size
            )
            results.append(
                Result("b", "probescope: read trace_pipe_raw", n, [raw_seconds], probescope=True)
            )
            raw_file = work / f"cpu{options.cpu}.raw"
            raw_file.write_bytes(raw)

            trace_dat = work / "trace.dat"
            restore = restore_trace_dat(work, raw_file, trace_dat)

            event_format = parse_event_format(format_text, system=group)
            sub_buffers = list(split_sub_buffers(layout, raw))

            def decoder() -> EventDecoder:
                decoder = EventDecoder(layout, comms=comms)
                decoder.add_event(event_format)
                return decoder

            def decode_events() -> None:
                decode = decoder().decode
                count = 0
                for sub_buffer in sub_buffers:
                    count += len(decode(sub_buffer, options.cpu))
                if count != n:
                    raise RuntimeError(f"decoded {count} events, expected {n}")

            results.append(
                Result(
                    "b",
                    "probescope: decode to Events",
                    n,
                    timed(decode_events, options.runs),
                    probescope=True,
                )
            )

            def decode_text() -> None:
                decode = decoder().decode
                with open(os.devnull, "wb") as null:
                    sink = TextSink(null, context=KernelContext.for_release(os.uname().release))
                    for sub_buffer in sub_buffers:
                        sink.write_batch(decode(sub_buffer, options.cpu))
                    sink.close()

            decode_seconds = results[-1].seconds
            results.append(
                Result(
                    "b",
                    "probescope: read + decode to Events",
                    n,
                    [raw_seconds + statistics.median(decode_seconds)],
                    probescope=True,
                )
            )
            results.append(
                Result(
                    "b",
                    "probescope: decode to text lines",
                    n,
                    timed(decode_text, options.runs),
                    probescope=True,
                )
            )
            check_text(decoder(), sub_buffers, options.cpu, trace_text)

            if restore is None:
                results.append(
                    Result(
                        "b",
                        "trace-cmd report",
                        n,
                        timed(lambda: report(trace_dat, n), options.runs),
                    )
                )
            else:
                print(f"trace-cmd report skipped: {restore}", file=sys.stderr)

            pipe_seconds = []
            for _ in range(options.runs):
                fill(instance, group, binary, options)
                started = time.perf_counter()
                subprocess.run(
                    ["head", "-n", str(n), str(instance / "trace_pipe")],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,  # head cannot seek back in a pipe file
                    check=True,
                    timeout=120,
                )
                pipe_seconds.append(time.perf_counter() - started)
            results.append(Result("b", "kernel: head -n N trace_pipe", n, pipe_seconds))
            if options.keep:
                options.keep.mkdir(parents=True, exist_ok=True)
                for path in (raw_file, trace_dat):
                    if path.exists():
                        shutil.copy(path, options.keep / path.name)
                (options.keep / "format").write_text(format_text)
                (options.keep / "trace").write_bytes(trace_text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def restore_trace_dat(work: Path, raw_file: Path, trace_dat: Path) -> str | None:
    """Build trace.dat from the saved sub-buffers: `restore -c` writes the headers and event
    formats of this system, `restore -i` appends the per-CPU raw data. None when it worked."""
    if shutil.which("trace-cmd") is None:
        return "trace-cmd is not installed"
    header = work / "header.dat"
    steps = [
        ["trace-cmd", "restore", "-c", "-o", str(header)],
        ["trace-cmd", "restore", "-i", str(header), "-o", str(trace_dat), str(raw_file)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, cwd=work)
        if done.returncode != 0 or not (header if step is steps[0] else trace_dat).exists():
            return f"{' '.join(step)} failed: {done.stderr.strip()[-300:]}"
    return None


def report(trace_dat: Path, n: int) -> None:
    done = subprocess.run(
        ["trace-cmd", "report", "-i", str(trace_dat)], capture_output=True, check=True
    )
    lines = done.stdout.count(b": hit: ")
    if lines != n:
        raise RuntimeError(f"trace-cmd report printed {lines} events, expected {n}")


def check_text(decoder: EventDecoder, sub_buffers: list[bytes], cpu: int, trace: bytes) -> None:
    """probescope's text for the sub-buffers must be the kernel's `trace` body, byte for byte."""
    stream = io.BytesIO()
    sink = TextSink(stream, context=KernelContext.for_release(os.uname().release))
    for sub_buffer in sub_buffers:
        sink.write_batch(decoder.decode(sub_buffer, cpu))
    lines = trace.split(b"\n")
    header = 0
    while header < len(lines) and lines[header].startswith(b"#"):
        header += 1
    if stream.getvalue() != b"\n".join(lines[header:]):
        raise RuntimeError("probescope's text differs from the kernel's trace")


# --------------------------------------------------------------------------------------------
# processes

TIMEOUT = 300.0


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM (readers drain and exit), SIGKILL after 10 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class Measured:
    """A finished consumer: exit code, wall time, and its rusage as RUSAGE_CHILDREN tool saw it
    (so CPU time includes the children the consumer waited for, such as a `-c` target)."""

    returncode: int
    seconds: float
    peak_rss_kb: int
    cpu_seconds: float


@dataclass
class Running:
    """A consumer started under the rusage tool (RUSAGE_SOURCE)."""

    process: subprocess.Popen[Any]
    started: float
    report: Path

    @classmethod
    def start(cls, tool: Path, argv: list[str], stdout: Path | None, stderr: Path) -> Running:
        report = stderr.with_suffix(".rusage")
        with ExitStack() as files:
            out = files.enter_context(stdout.open("w")) if stdout else subprocess.DEVNULL
            err = files.enter_context(stderr.open("w"))
            started = time.monotonic()
            process = subprocess.Popen([str(tool), str(report), *argv], stdout=out, stderr=err)
        return cls(process, started, report)

    def wait(self, timeout: float = TIMEOUT) -> Measured:
        try:
            self.process.wait(max(0.0, self.started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(self.process)  # the tool forwards SIGTERM to the consumer
        seconds = time.monotonic() - self.started
        values = dict(item.split("=") for item in self.report.read_text().split())
        self.report.unlink()
        return Measured(
            int(values["status"]), seconds, int(values["maxrss_kb"]), float(values["cpu_s"])
        )


def run_measured(tool: Path, argv: list[str], stdout: Path, stderr: Path) -> Measured:
    return Running.start(tool, argv, stdout, stderr).wait()


# --------------------------------------------------------------------------------------------
# part (a): what a probe hit costs the traced program


@dataclass(frozen=True)
class Sample:
    ns_per_call: float
    received: int | None = None  # events the consumer got (bpftrace: hits it counted)
    lost: int | None = None  # calls made - events received; with nobody reading: overwritten
    note: str = ""


@dataclass
class HitCost:
    variant: Variant
    consumer: str
    samples: list[Sample] = field(default_factory=list)
    probescope: bool = False
    baseline: bool = False
    skipped: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(s.ns_per_call for s in self.samples)


class Consumer(NamedTuple):
    name: str
    measure: Callable[[Variant], Sample]
    probescope: bool = False
    baseline: bool = False


class HitCostBench:
    """The consumers of part (a); each method measures one run of one variant."""

    def __init__(
        self,
        options: Options,
        scratch: Path,
        hand: Hand,
        reader: Path,
        spinner: Path,
        perf: tuple[str, str | None],
    ) -> None:
        tools = [c for c in sorted(os.sched_getaffinity(0)) if c != options.cpu] or [options.cpu]
        taskset = shutil.which("taskset") or "taskset"
        self.pin_target = [taskset, "-c", str(options.cpu)]
        self.pin_tools = [taskset, "-c", cpu_list(tools)]
        self.scratch = scratch
        self.hand = hand
        self.reader = reader
        self.spinner = spinner
        self.perf_group, self.perf_reason = perf

    def consumers(self) -> list[Consumer]:
        return [
            Consumer("no probe", self.no_probe),
            Consumer("hand, nobody reading (floor)", self.nobody_reading),
            Consumer("hand + baseline reader (poll)", self.poll_reader, baseline=True),
            Consumer("hand + blocking reader (cat-like)", self.blocking_reader),
            Consumer("baseline + probescope's settings", self.probescope_settings),
            Consumer("control: baseline + busy CPU", self.busy_neighbour),
            Consumer("probescope trace -o FILE", self.probescope, probescope=True),
            Consumer("perf record (perf probe)", self.perf),
            Consumer("bpftrace count()", self.bpftrace),
        ]

    def _loop(self, variant: Variant) -> list[str]:
        return [*self.pin_target, str(variant.binary), "loop", str(variant.hits)]

    def _target(self, variant: Variant) -> TargetReport:
        done = subprocess.run(
            self._loop(variant), capture_output=True, text=True, timeout=TIMEOUT, check=True
        )
        return parse_target(done.stdout, "target")

    def no_probe(self, variant: Variant) -> Sample:
        return Sample(self._target(variant).ns_per_call)

    def _hand(self, variant: Variant, readers: list[list[str]], busy: bool = False) -> Sample:
        hand = self.hand
        hand.clear()
        before = hand.counters()
        with ExitStack() as stack:
            if busy:
                spin = subprocess.Popen([*self.pin_tools, str(self.spinner), "spin"])
                stack.callback(stop, spin)
            for argv in readers:
                process = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
                stack.callback(stop, process)
            hand.enable(variant.key)
            try:
                report = self._target(variant)
            finally:
                hand.enable(variant.key, False)
        counted = hand.counters() - before
        if not readers:
            return Sample(report.ns_per_call, None, counted.lost)
        return Sample(report.ns_per_call, counted.read, counted.lost)

    def nobody_reading(self, variant: Variant) -> Sample:
        return self._hand(variant, [])

    def poll_reader(self, variant: Variant, busy: bool = False) -> Sample:
        argv = [*self.pin_tools, str(self.reader), "poll", os.devnull]
        return self._hand(variant, [argv + [str(p) for p in self.hand.pipes()]], busy)

    def blocking_reader(self, variant: Variant) -> Sample:
        argv = [*self.pin_tools, str(self.reader), "block", os.devnull]
        return self._hand(variant, [[*argv, str(pipe)] for pipe in self.hand.pipes()])

    def probescope_settings(self, variant: Variant) -> Sample:
        """The baseline with what probescope sets in its instance: the mono clock, record-tgid,
        and a pid filter following forks (on this process, so it covers the target)."""
        root = self.hand.root
        settings = [
            ("trace_clock", "mono", "local"),
            ("options/record-tgid", "1", "0"),
            ("options/event-fork", "1", "0"),
            ("set_event_pid", str(os.getpid()), ""),
        ]
        try:
            for name, value, _ in settings:
                _write(root / name, value)
            return self.poll_reader(variant)
        finally:
            for name, _, default in reversed(settings):
                _write(root / name, default)

    def busy_neighbour(self, variant: Variant) -> Sample:
        return self.poll_reader(variant, busy=True)

    def probescope(self, variant: Variant) -> Sample:
        output = self.scratch / "probescope.out"
        argv = [*self.pin_tools, *probescope_command(variant.spec, self._loop(variant), output)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"probescope failed ({done.returncode}):\n{done.stderr[-2000:]}")
        report = parse_target(done.stdout, "probescope trace -c")
        received = count_events(output)
        output.unlink()
        _, said_lost = probescope_summary(done.stderr)
        lost = variant.hits - received
        note = "" if said_lost == lost else f"probescope reported {said_lost:,} lost, not {lost:,}"
        return Sample(report.ns_per_call, received, lost, note)

    def perf(self, variant: Variant) -> Sample:
        if self.perf_reason:
            raise Unavailable(self.perf_reason)
        data = self.scratch / "perf.data"
        event = f"{self.perf_group}:{perf_event(variant)}"
        argv = [*self.pin_tools, "perf", "record", "-q", "-e", event, "-o", str(data), "--"]
        done = subprocess.run(
            argv + self._loop(variant), capture_output=True, text=True, timeout=TIMEOUT
        )
        if done.returncode != 0:
            raise Unavailable(f"perf record failed: {done.stderr.strip()[-300:]}")
        report = parse_target(done.stdout, "perf record")
        received = perf_samples(data, event)
        data.unlink()
        return Sample(report.ns_per_call, received, variant.hits - received)

    def bpftrace(self, variant: Variant) -> Sample:
        if shutil.which("bpftrace") is None:
            raise Unavailable("bpftrace is not installed")
        program = f"uprobe:{variant.binary}:probed {{ @hits = count(); }}"
        argv = [*self.pin_tools, "bpftrace", "-e", program, "-c", shlex.join(self._loop(variant))]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        counted = re.search(r"@hits: (\d+)", done.stdout)
        if done.returncode != 0 or counted is None:
            raise Unavailable(f"bpftrace failed: {(done.stderr or done.stdout).strip()[-300:]}")
        report = parse_target(done.stdout, "bpftrace -c")
        hits = int(counted.group(1))
        return Sample(report.ns_per_call, hits, variant.hits - hits)


def part_a_hit_cost(options: Options) -> list[HitCost]:
    work = Path(tempfile.mkdtemp(prefix="probescope-bench-"))
    scratch = Path(tempfile.mkdtemp(prefix="probescope-bench-", dir=SCRATCH_ROOT))
    try:
        variants = build_variants(work, options)
        reader = compile_c(READER_SOURCE, work / "probescope-bench-reader", "-O2")
        with (
            hand_instance({v.key: v.location for v in variants}) as hand,
            perf_probes(variants) as perf,
        ):
            bench = HitCostBench(options, scratch, hand, reader, variants[0].binary, perf)
            consumers = bench.consumers()
            rows = {
                (variant.key, c.name): HitCost(
                    variant, c.name, probescope=c.probescope, baseline=c.baseline
                )
                for variant in variants
                for c in consumers
            }
            for run in range(options.cost_runs):
                print(f"(a) run {run + 1}/{options.cost_runs}", file=sys.stderr)
                turn = consumers[run % len(consumers) :] + consumers[: run % len(consumers)]
                for variant in variants:
                    for consumer in turn:
                        row = rows[(variant.key, consumer.name)]
                        if row.skipped:
                            continue
                        try:
                            row.samples.append(consumer.measure(variant))
                        except Unavailable as reason:
                            row.skipped = str(reason)
            return list(rows.values())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


DUPLICATES = (
    "negative lost: more events than calls, i.e. duplicates (seen with perf record: the same "
    "sample, timestamp and argument, twice, about once per 10^5-10^6 hits)."
)


def _median_of(values: list[int | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{round(statistics.median(present)):,}" if present else "—"


def print_hit_costs(rows: list[HitCost], options: Options) -> None:
    print(
        f"\n(a) cost per probe hit in the traced program: ns per call, median of "
        f"{options.cost_runs} interleaved runs (min–max); target on CPU {options.cpu}, "
        "tools on the other CPUs"
    )
    verdicts = []
    notes: list[str] = []
    for variant in dict.fromkeys(r.variant for r in rows):
        mine = [r for r in rows if r.variant == variant]
        print(
            f"  {variant.key}: probed() starts with `{variant.instruction}` "
            f"({variant.handling}); {variant.hits:,} calls per run"
        )
        print(
            f"    {'consumer':36} {'ns/call':>9} {'min–max':>17} {'+ns/hit':>9} "
            f"{'events read':>12} {'lost':>10} {'vs baseline':>12}"
        )
        floor = next(r for r in mine if r.consumer == "no probe").median
        baseline = next(r for r in mine if r.baseline)
        base_extra = baseline.median - floor if baseline.samples else float("nan")
        for row in mine:
            if row.skipped or not row.samples:
                print(f"    {row.consumer:36} skipped: {row.skipped}")
                continue
            values = [s.ns_per_call for s in row.samples]
            extra = row.median - floor
            spread = f"{min(values):,.1f}–{max(values):,.1f}"
            ratio = "" if row.consumer == "no probe" else f"{extra / base_extra:11.2f}x"
            print(
                f"    {row.consumer:36} {row.median:9,.1f} {spread:>17} "
                f"{'' if row.consumer == 'no probe' else f'{extra:,.1f}':>9} "
                f"{_median_of([s.received for s in row.samples]):>12} "
                f"{_median_of([s.lost for s in row.samples]):>10} {ratio:>12}"
            )
            notes += [f"{variant.key}, {row.consumer}: {s.note}" for s in row.samples if s.note]
            if row.probescope:
                verdicts.append(f"{variant.key} {extra / base_extra:.2f}")
    print(
        "  +ns/hit: ns/call minus no probe's. vs baseline: +ns/hit over the baseline reader's "
        f"(probescope: {', '.join(verdicts) or 'not measured'}; target ≤ 1.05)."
    )
    for note in dict.fromkeys(notes):
        print(f"  note: {note}")
    if any((s.lost or 0) < 0 for row in rows for s in row.samples):
        print(f"  {DUPLICATES}")


# --------------------------------------------------------------------------------------------
# part (c): sustained load


@dataclass
class Load:
    consumer: str
    made: int = 0
    received: int | None = None
    reported_lost: int | None = None
    peak_rss_kb: int | None = None
    cpu_seconds: float | None = None
    seconds: float = 0.0  # the consumer's wall time, from its start to its exit
    probescope: bool = False
    skipped: str | None = None
    note: str = ""

    @property
    def lost(self) -> int | None:
        return None if self.received is None else self.made - self.received


class LoadBench:
    """The consumers of part (c); each method makes one paced run."""

    def __init__(self, options: Options, scratch: Path, hand: Hand, tools: dict[str, Path],
                 variant: Variant, perf: tuple[str, str | None]) -> None:  # fmt: skip
        self.options = options
        self.rusage = tools["rusage"]
        self.scratch = scratch
        self.hand = hand
        self.reader = tools["reader"]
        self.variant = variant
        self.perf_group, self.perf_reason = perf

    def _paced(self) -> list[str]:
        rate, seconds = self.options.rate, self.options.load_seconds
        return [str(self.variant.binary), "paced", str(rate), str(seconds)]

    def _files(self, name: str) -> tuple[Path, Path, Path]:
        return (self.scratch / f"{name}.out", self.scratch / f"{name}.stdout",
                self.scratch / f"{name}.stderr")  # fmt: skip

    def baseline_reader(self) -> Load:
        hand, key = self.hand, self.variant.key
        output, _, stderr = self._files("raw")
        hand.clear()
        before = hand.counters()
        argv = [str(self.reader), "poll", str(output), *(str(p) for p in hand.pipes())]
        reader = Running.start(self.rusage, argv, None, stderr)
        try:
            hand.enable(key)
            try:
                done = subprocess.run(
                    self._paced(), capture_output=True, text=True, timeout=TIMEOUT, check=True
                )
            finally:
                hand.enable(key, False)
            reader.process.send_signal(signal.SIGTERM)
        finally:
            measured = reader.wait()
        target = parse_target(done.stdout, "target")
        counted = hand.counters() - before
        size = output.stat().st_size
        output.unlink()
        return Load(
            "hand + baseline reader → raw file",
            target.calls,
            counted.read,
            counted.lost,
            measured.peak_rss_kb,
            measured.cpu_seconds,
            measured.seconds,
            note=f"{size / 1e6:.0f} MB of sub-buffers written",
        )

    def probescope(self, output_format: str, buffer_kb: int | None = None) -> Load:
        output, stdout, stderr = self._files(f"probescope-{output_format}")
        extra = ["-f", output_format] + (["--buffer-size", str(buffer_kb)] if buffer_kb else [])
        argv = probescope_command(self.variant.spec, self._paced(), output, *extra)
        measured = run_measured(self.rusage, argv, stdout, stderr)
        errors = stderr.read_text()
        if measured.returncode != 0:
            raise RuntimeError(f"probescope failed ({measured.returncode}):\n{errors[-2000:]}")
        target = parse_target(stdout.read_text(), "probescope trace -c")
        _, said_lost = probescope_summary(errors)
        received = count_events(output)
        size = output.stat().st_size
        output.unlink()
        name = f"probescope -f {output_format} -o FILE" + (
            f" --buffer-size {buffer_kb}" if buffer_kb else ""
        )
        return Load(
            name,
            target.calls,
            received,
            said_lost,
            measured.peak_rss_kb,
            measured.cpu_seconds - target.cpu_seconds,
            measured.seconds,
            probescope=True,
            note=f"{size / 1e6:.0f} MB written",
        )

    def perf(self) -> Load:
        if self.perf_reason:
            raise Unavailable(self.perf_reason)
        data, stdout, stderr = self._files("perf")
        event = f"{self.perf_group}:{perf_event(self.variant)}"
        argv = ["perf", "record", "-q", "-e", event, "-o", str(data), "--", *self._paced()]
        measured = run_measured(self.rusage, argv, stdout, stderr)
        if measured.returncode != 0:
            raise Unavailable(f"perf record failed: {stderr.read_text().strip()[-300:]}")
        target = parse_target(stdout.read_text(), "perf record")
        received = perf_samples(data, event)
        size = data.stat().st_size
        data.unlink()
        return Load(
            "perf record -o FILE",
            target.calls,
            received,
            None,
            measured.peak_rss_kb,
            measured.cpu_seconds - target.cpu_seconds,
            measured.seconds,
            note=f"{size / 1e6:.0f} MB written",
        )

    def trace_cmd(self) -> Load:
        if shutil.which("trace-cmd") is None:
            raise Unavailable("trace-cmd is not installed")
        data, stdout, stderr = self._files("trace-cmd")
        instance = f"probescope-bench-tc-{os.getpid()}"
        event = f"{self.hand.group}/{self.variant.key}"
        argv = ["trace-cmd", "record", "-B", instance, "-e", event, "-o", str(data),
                *self._paced()]  # fmt: skip
        try:
            measured = run_measured(self.rusage, argv, stdout, stderr)
        finally:
            left = TRACEFS / "instances" / instance
            if left.exists():
                _retry_busy(lambda: os.rmdir(left))
        errors = stderr.read_text()
        if measured.returncode != 0 or not data.exists():
            reason = " ".join(line.strip() for line in errors.strip().splitlines()[-2:])
            raise Unavailable(f"trace-cmd record failed here: {reason}")
        target = parse_target(stdout.read_text(), "trace-cmd record")
        report = subprocess.run(
            ["trace-cmd", "report", "-i", str(data)], capture_output=True, timeout=TIMEOUT
        )
        received = report.stdout.count(f" {self.variant.key}:".encode())
        return Load(
            "trace-cmd record",
            target.calls,
            received,
            None,
            measured.peak_rss_kb,
            measured.cpu_seconds - target.cpu_seconds,
            measured.seconds,
        )


def part_c_load(options: Options) -> list[Load]:
    work = Path(tempfile.mkdtemp(prefix="probescope-bench-"))
    scratch = Path(tempfile.mkdtemp(prefix="probescope-bench-", dir=SCRATCH_ROOT))
    rows: list[Load] = []

    def measure(name: str, function: Callable[[], Load]) -> Load | None:
        print(f"(c) {name}", file=sys.stderr)
        try:
            row = function()
        except Unavailable as reason:
            rows.append(Load(name, skipped=str(reason)))
            return None
        rows.append(row)
        return row

    try:
        variant = build_variants(work, options)[0]
        tools = {
            "reader": compile_c(READER_SOURCE, work / "probescope-bench-reader", "-O2"),
            "rusage": compile_c(RUSAGE_SOURCE, work / "probescope-bench-rusage", "-O2"),
        }
        with (
            hand_instance({variant.key: variant.location}) as hand,
            perf_probes([variant]) as perf,
        ):
            bench = LoadBench(options, scratch, hand, tools, variant, perf)
            measure("hand + baseline reader", bench.baseline_reader)
            for output_format in ("text", "jsonl"):
                row = measure(
                    f"probescope {output_format}", partial(bench.probescope, output_format)
                )
                for buffer_kb in options.load_buffers_kb:
                    if row is None or (row.lost == 0 and row.reported_lost == 0):
                        break
                    row = measure(
                        f"probescope {output_format} --buffer-size {buffer_kb}",
                        partial(bench.probescope, output_format, buffer_kb),
                    )
            measure("perf record", bench.perf)
            measure("trace-cmd record", bench.trace_cmd)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def print_loads(rows: list[Load], options: Options) -> None:
    print(
        f"\n(c) sustained load: target paced at {options.rate:,} calls/s for "
        f"{options.load_seconds:g} s (-O0 build, emulated probe), outputs on tmpfs"
    )
    print(
        f"    {'consumer':46} {'calls made':>10} {'received':>10} {'lost':>9} {'said lost':>9} "
        f"{'peak RSS MB':>11} {'CPU s':>6} {'wall s':>6} {'CPU/wall':>8}"
    )
    baseline = next((r for r in rows if r.consumer.startswith("hand") and not r.skipped), None)
    for row in rows:
        if row.skipped:
            print(f"    {row.consumer:46} skipped: {row.skipped}")
            continue
        said = "—" if row.reported_lost is None else f"{row.reported_lost:,}"
        rss = "—" if row.peak_rss_kb is None else f"{row.peak_rss_kb / 1024:.1f}"
        cpu = row.cpu_seconds or 0.0
        print(
            f"    {row.consumer:46} {row.made:10,} {row.received or 0:10,} {row.lost or 0:9,} "
            f"{said:>9} {rss:>11} {cpu:6.2f} {row.seconds:6.1f} {cpu / max(row.seconds, 1e-9):8.2f}"
            + (f"  ({row.note})" if row.note else "")
        )
    print(
        "  lost: calls made - events in the output; said lost: the consumer's own count; CPU s "
        "excludes the target's; wall s: the consumer's whole life, start-up and drain included."
    )
    if any((row.lost or 0) < 0 for row in rows):
        print(f"  {DUPLICATES}")
    for row in rows:
        if not row.probescope or row.skipped:
            continue
        ok = row.lost == 0 and (row.peak_rss_kb or 0) < 200 * 1024
        cpu_ratio = (
            f"; CPU {row.cpu_seconds / baseline.cpu_seconds:.0f}x the baseline reader's"
            if baseline and baseline.cpu_seconds and row.cpu_seconds
            else ""
        )
        print(
            f"  {row.consumer}: {'meets' if ok else 'MISSES'} the targets lost = 0 and peak RSS "
            f"< 200 MB (lost {row.lost or 0:,}, {(row.peak_rss_kb or 0) / 1024:.0f} MB{cpu_ratio})"
        )


# --------------------------------------------------------------------------------------------
# tables and the command line


def print_results(results: list[Result], options: Options) -> None:
    print(f"\n(b) ring-buffer decode: median of {options.runs} runs on {options.events:,} events")
    by_name = {r.name: r for r in results}
    references = [
        ("Events/peer", by_name.get("probescope: decode to Events")),
        ("text/peer", by_name.get("probescope: decode to text lines")),
    ]
    print(
        f"{'part':4} {'measurement':40} {'events':>9} {'median s':>9} {'events/s':>12}"
        + "".join(f" {label:>12}" for label, _ in references)
    )
    for result in results:
        ratios = "".join(
            f" {reference.rate / result.rate:11.2f}x"
            if reference is not None and not result.probescope
            else " " * 13
            for _, reference in references
        )
        print(
            f"{result.part:4} {result.name:40} {result.events:9d} {result.median:9.3f} "
            f"{result.rate:12,.0f}{ratios}"
        )
    print(
        "Events/peer, text/peer: events/s of probescope decoding into Event objects / into "
        "kernel-identical text lines, over the peer's events/s (above 1: probescope is faster)."
    )


@dataclass(frozen=True)
class Part:
    measure: Callable[[Options], list[Any]]
    report: Callable[[list[Any], Options], None]


PARTS: dict[str, Part] = {
    "a": Part(part_a_hit_cost, print_hit_costs),
    "b": Part(part_b_decode, print_results),
    "c": Part(part_c_load, print_loads),
}


def main(argv: list[str] | None = None) -> int:
    defaults = Options(events=1_000_000, runs=3, cpu=min(1, (os.cpu_count() or 1) - 1), keep=None)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run")
    parser.add_argument("--events", type=int, default=defaults.events, help="(b) events decoded")
    parser.add_argument("--runs", type=int, default=defaults.runs, help="(b) runs")
    parser.add_argument("--cpu", type=int, default=defaults.cpu, help="the target's CPU")
    parser.add_argument("--keep", type=Path, help="(b) copy the captured data into this directory")
    parser.add_argument("--cost-runs", type=int, default=defaults.cost_runs, help="(a) runs")
    parser.add_argument(
        "--hits", type=int, default=defaults.hits, help="(a) calls per run, emulated probe"
    )
    parser.add_argument(
        "--stepped-hits",
        type=int,
        default=defaults.stepped_hits,
        help="(a) calls per run, single-stepped probe",
    )
    parser.add_argument("--rate", type=int, default=defaults.rate, help="(c) calls per second")
    parser.add_argument(
        "--load-seconds", type=float, default=defaults.load_seconds, help="(c) duration"
    )
    parser.add_argument(
        "--load-buffers",
        default=",".join(str(kb) for kb in defaults.load_buffers_kb),
        help="(c) --buffer-size values (KB) tried in turn while probescope loses events",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_tracefs.py needs root (it defines uprobes in tracefs)", file=sys.stderr)
        return 2
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"unknown parts {unknown}; present: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    options = Options(
        args.events,
        args.runs,
        args.cpu,
        args.keep,
        cost_runs=args.cost_runs,
        hits=args.hits,
        stepped_hits=args.stepped_hits,
        rate=args.rate,
        load_seconds=args.load_seconds,
        load_buffers_kb=tuple(int(kb) for kb in args.load_buffers.split(",") if kb.strip()),
    )
    load = os.getloadavg()
    started = time.monotonic()
    results = {part: PARTS[part].measure(options) for part in parts}
    print(
        f"kernel {os.uname().release}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"load average {load[0]:.2f} at start, {time.monotonic() - started:.0f} s"
    )
    for part in parts:
        PARTS[part].report(results[part], options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
