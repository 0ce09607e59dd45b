"""Benchmark of recording: `probescope record` vs `trace-cmd record` vs `perf record`, one run.

Run as root: `.venv/bin/python bench/bench_record.py [--calls N] [--runs R]`.

The load is the highest rate this machine produces: a C target calls a uprobed function
`probed(i)` N times in a tight loop (no pacing: as fast as the kernel's uprobe lets it), and
yields the CPU every 64 calls, so sched_switch fires too. Each recorder records the uprobe and
sched:sched_switch of the target (started by the recorder), one after the other, R times:

  - `probescope record -c TARGET` (tracefs engine: sub-buffers copied undecoded);
  - `trace-cmd record -d -B INSTANCE -e GROUP:probed -e sched:sched_switch TARGET` (`-d`: no
    function tracer, so it does not write ftrace_enabled, which this host refuses); the
    uprobe is defined by hand in a group named after this process;
  - `perf record -e GROUP:probed -e sched:sched_switch -- TARGET`.

Measured: uprobe events in the file against the N calls made (lost = N - recorded), the
recorder's CPU time (its and its children's rusage minus the target's own CPU time, which the
target prints), wall time, file size; then report speed on each file — `probescope report`,
`trace-cmd report` (on probescope's file too: the same bytes), `perf script` — in events/s.
Outputs go to /dev/shm; what is created in tracefs is removed on every exit path.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
TARGET = r"""
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) int probed(int i) { __asm__ volatile("" ::: "memory"); return i + 1; }
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000, total = 0;
    struct timespec start, end, cpu;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < n; i++) {
        total += probed((int)i);
        if ((i & 63) == 63)
            sched_yield();
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    fprintf(stderr, "calls %ld cpu_ns %ld wall_ns %ld total %ld\n", n,
            cpu.tv_sec * 1000000000L + cpu.tv_nsec,
            (end.tv_sec - start.tv_sec) * 1000000000L + (end.tv_nsec - start.tv_nsec), total);
    return 0;
}
"""


@dataclass
class Recorded:
    tool: str
    events: int = 0
    lost: int = 0
    recorder_cpu: float = 0.0
    wall: float = 0.0
    size: int = 0
    report_seconds: float = 0.0
    report_events: int = 0
    skipped: str = ""


def run_child(
    argv: list[str], **kwargs: object
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run a recorder; (result, CPU seconds of it and its children, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, cpu, wall


def target_cpu(stderr: str) -> float:
    for line in stderr.splitlines():
        if line.startswith("calls "):
            return int(line.split()[3]) / 1e9
    raise RuntimeError(f"the target did not report: {stderr[-400:]}")


def symbol_offset(binary: Path, name: str) -> int:
    sys.path.insert(0, str(Path(__file__).parents[1] / "src"))
    from probescope.symbols.table import SymbolTable

    return SymbolTable.for_path(str(binary)).lookup(name).offset


@contextlib.contextmanager
def uprobe_group(binary: Path) -> Iterator[str]:
    group = f"probescope_bench_{os.getpid()}"
    line = f"p:{group}/probed {binary}:{symbol_offset(binary, 'probed'):#x} i=%di:s32\n"
    fd = os.open(TRACEFS / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    try:
        yield group
    finally:
        for _ in range(50):
            fd = os.open(TRACEFS / "uprobe_events", os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, f"-:{group}/probed\n".encode())
                break
            except OSError:
                time.sleep(0.1)
            finally:
                os.close(fd)


def probescope(work: Path, binary: Path, calls: int) -> Recorded:
    out = work / "probescope.dat"
    argv = [
        sys.executable,
        "-m",
        "probescope",
        "record",
        "-q",
        "--engine",
        "tracefs",
        "-o",
        str(out),
        "-c",
        f"{binary} {calls}",
        f"{binary}:probed i=arg1:s32",
        "t:sched:sched_switch",
    ]
    result, cpu, wall = run_child(argv, check=True)
    from probescope.record.recording import Recording

    with Recording.from_path(out) as recording:
        events = sum(
            sum(1 for e in batch.events if e.type.name == "probed") for batch in recording.batches()
        )
    row = Recorded(
        "probescope record",
        events,
        calls - events,
        cpu - target_cpu(result.stderr),
        wall,
        out.stat().st_size,
    )
    report = [sys.executable, "-m", "probescope", "report", "-q", "-o", "/dev/null", str(out)]
    row.report_seconds, row.report_events = timed(report), count_all(out)
    return row


def count_all(path: Path) -> int:
    from probescope.record.recording import Recording

    with Recording.from_path(path) as recording:
        return recording.events_total()


def timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def trace_cmd(work: Path, binary: Path, calls: int, group: str) -> Recorded:
    tool = shutil.which("trace-cmd")
    if tool is None:
        return Recorded("trace-cmd record", skipped="trace-cmd is not installed")
    out = work / "trace-cmd.dat"
    instance = f"probescope_bench_{os.getpid()}"
    argv = [
        tool,
        "record",
        "-q",
        "-d",
        "-B",
        instance,
        "-e",
        f"{group}:probed",
        "-e",
        "sched:sched_switch",
        "-o",
        str(out),
        str(binary),
        str(calls),
    ]
    try:
        result, cpu, wall = run_child(argv)
    finally:
        with contextlib.suppress(OSError):
            (TRACEFS / "instances" / instance).rmdir()
    if result.returncode != 0 or not out.exists():
        return Recorded("trace-cmd record", skipped=(result.stderr.strip() or "failed")[-200:])
    text = subprocess.run([tool, "report", str(out)], capture_output=True, text=True).stdout
    events = sum(1 for line in text.splitlines() if " probed:" in line)
    row = Recorded(
        "trace-cmd record",
        events,
        calls - events,
        cpu - target_cpu(result.stderr),
        wall,
        out.stat().st_size,
    )
    row.report_seconds = timed([tool, "report", str(out)])
    row.report_events = sum(1 for line in text.splitlines() if ": " in line)
    return row


def perf(work: Path, binary: Path, calls: int, group: str) -> Recorded:
    tool = shutil.which("perf")
    if tool is None:
        return Recorded("perf record", skipped="perf is not installed")
    out = work / "perf.data"
    argv = [
        tool,
        "record",
        "-q",
        "-e",
        f"{group}:probed",
        "-e",
        "sched:sched_switch",
        "-o",
        str(out),
        "--",
        str(binary),
        str(calls),
    ]
    result, cpu, wall = run_child(argv)
    if result.returncode != 0:
        return Recorded("perf record", skipped=result.stderr.strip()[-200:])
    script = [tool, "script", "-i", str(out)]
    text = subprocess.run(script, capture_output=True, text=True).stdout
    events = sum(1 for line in text.splitlines() if f"{group}:probed" in line)
    row = Recorded(
        "perf record",
        events,
        calls - events,
        cpu - target_cpu(result.stderr),
        wall,
        out.stat().st_size,
    )
    row.report_seconds = timed(script)
    row.report_events = len(text.splitlines())
    return row


def median(rows: list[Recorded], key: Callable[[Recorded], float]) -> float:
    return statistics.median(key(row) for row in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0 or not (TRACEFS / "uprobe_events").exists():
        print("bench_record: needs root and tracefs", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="probescope-bench-") as directory:
        work = Path(directory)
        (work / "target.c").write_text(TARGET)
        binary = work / "target"
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(work / "target.c")], check=True)
        results: dict[str, list[Recorded]] = {}
        with uprobe_group(binary) as group:
            for _ in range(args.runs):
                for row in (
                    probescope(work, binary, args.calls),
                    trace_cmd(work, binary, args.calls, group),
                    perf(work, binary, args.calls, group),
                ):
                    results.setdefault(row.tool, []).append(row)
                for name in ("probescope.dat", "trace-cmd.dat", "perf.data"):
                    with contextlib.suppress(FileNotFoundError):
                        (work / name).unlink()
            # trace-cmd report on probescope's own file: the same bytes, both readers
            probescope(work, binary, args.calls)
            tool = shutil.which("trace-cmd")
            same_file = (
                timed([tool, "report", str(work / "probescope.dat")]) if tool else float("nan")
            )
    print(
        f"bench_record: {args.calls} calls of a uprobed function (+ sched_switch), "
        f"{args.runs} runs, medians\n"
    )
    header = (
        f"{'recorder':18} {'uprobe events':>13} {'lost':>8} {'recorder CPU s':>14} "
        f"{'wall s':>7} {'file MB':>8} {'report ev/s':>12}"
    )
    print(header)
    base = results["probescope record"]
    for tool, rows in results.items():
        done = [r for r in rows if not r.skipped]
        if not done:
            print(f"{tool:18} skipped: {rows[0].skipped}")
            continue
        speed = median(done, lambda r: r.report_events / r.report_seconds)
        print(
            f"{tool:18} {median(done, lambda r: r.events):13.0f} "
            f"{median(done, lambda r: r.lost):8.0f} {median(done, lambda r: r.recorder_cpu):14.2f} "
            f"{median(done, lambda r: r.wall):7.2f} {median(done, lambda r: r.size) / 1e6:8.1f} "
            f"{speed:12.0f}"
        )
    ours = median(base, lambda r: r.report_events / r.report_seconds)
    print()
    for tool, rows in results.items():
        done = [r for r in rows if not r.skipped]
        if tool == "probescope record" or not done:
            continue
        cpu = median(base, lambda r: r.recorder_cpu) / max(
            median(done, lambda r: r.recorder_cpu), 1e-9
        )
        theirs = median(done, lambda r: r.report_events / r.report_seconds)
        print(f"probescope / {tool}: recorder CPU x{cpu:.2f}, report speed x{ours / theirs:.2f}")
    events = median(base, lambda r: r.report_events)
    if same_file == same_file:
        print(
            f"on probescope's own file: probescope report {ours:.0f} ev/s, "
            f"trace-cmd report {events / same_file:.0f} ev/s (x{ours / (events / same_file):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
