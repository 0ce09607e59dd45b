"""Benchmark of aggregations, probescope vs its peers, in one run.

Run as root: `.venv/bin/python bench/bench_aggregate.py [--parts a,b,c] [--runs R] ...`.

(a) cost per hit to count hits by probe. A C target calls `probed()` --hits times in a tight
    loop and times the loop itself (clock_gettime), so the traced program's own cost per call
    is what is measured, never a tool's start-up; `probed` starts with `push %rbp` (the kernel
    emulates it). Consumers, interleaved in each repetition: no probe; `probescope count` with
    the bpf engine (aggregated in the kernel), with the tracefs engine (records aggregated in
    place from the ring buffer) and with the ptrace engine (fewer hits: --ptrace-hits);
    bpftrace `@[probe] = count()`; bcc's `funccount` (bpfcc-tools; it needs kernel headers,
    and says so when they are missing).
    Each consumer's count is checked against the calls made. Ratios: extra ns per hit over no
    probe, against bpftrace's. `probescope count --engine bpf` aggregates in the kernel
    (a per-CPU hash map updated by the probe's program; target: <= 1.0x bpftrace).
(b) user-space aggregation throughput from captured sub-buffers. --events hits of a probe
    with an int argument are recorded raw (the tracefs engine's own sub-buffers, kept in
    memory), then aggregated from those bytes: counts by probe, by (probe, argument), a log2
    histogram of the argument, in place; the same count through the decoder and the event
    path; and decoding into Events alone, for reference. Target: >= 2 M events/s. (The in-place
    path counts runs of same-size records in C; the record-by-record walk it falls back to for
    mixed sub-buffers is measured too.)
(c) start-up: from launching the tool to the traced command's first instruction of `main`
    (its probes are armed before it runs): `probescope latency -c` (bpf in the kernel, and
    tracefs) vs bpftrace with an entry/return histogram (`funclatency` from bcc needs kernel
    headers, like funccount).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probescope.aggregate.aggregators import EventAggregator
from probescope.aggregate.keys import KeyPlan
from probescope.aggregate.records import RecordAggregator
from probescope.engines.base import EngineOptions
from probescope.session import Session
from probescope.traceevent.decoder import EventDecoder

TARGET = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}
__attribute__((noinline)) int probed(int x) { return x + 1; }
int main(int argc, char **argv) {
    printf("main %ld\n", now());
    fflush(stdout);
    long n = argc > 1 ? atol(argv[1]) : 1000000, sum = 0;
    long start = now();
    for (long i = 0; i < n; i++)
        sum += probed((int)(i & 1023));
    long elapsed = now() - start;
    printf("calls %ld ns_per_call %.2f sum %ld\n", n, (double)elapsed / (n ? n : 1), sum);
    return 0;
}
"""

PROBESCOPE = [sys.executable, "-m", "probescope"]
TIMEOUT = 600


@dataclass
class Options:
    parts: list[str]
    runs: int = 3
    hits: int = 1_000_000
    ptrace_hits: int = 100_000
    events: int = 1_000_000
    cpu: int = 0


@dataclass
class Row:
    name: str
    values: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


def build(directory: Path) -> Path:
    source = directory / "target.c"
    source.write_text(TARGET)
    binary = directory / "target"
    subprocess.run(
        ["gcc", "-O0", "-fno-omit-frame-pointer", "-o", str(binary), str(source)], check=True
    )
    return binary


def per_call(output: str) -> tuple[int, float]:
    found = re.search(r"calls (\d+) ns_per_call ([\d.]+)", output)
    if found is None:
        raise RuntimeError(f"no timing in the target's output: {output[-500:]!r}")
    return int(found.group(1)), float(found.group(2))


def pinned(argv: list[str], cpu: int) -> list[str]:
    taskset = shutil.which("taskset")  # a full path: bpftrace -c refuses a bare name
    return [os.path.realpath(taskset), "-c", str(cpu), *argv] if taskset else argv


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)


# --- (a) -----------------------------------------------------------------------------------


def part_a(options: Options, work: Path) -> list[Row]:
    binary = build(work)
    target = str(binary)
    spec = f"{target}:probed"
    hits, slow_hits = options.hits, options.ptrace_hits

    def none() -> tuple[str, int]:
        return run(pinned([target, str(hits)], options.cpu)).stdout, hits

    def tracefs() -> tuple[str, int]:
        command = " ".join(pinned([target, str(hits)], options.cpu))
        done = run([*PROBESCOPE, "count", spec, "--engine", "tracefs", "-f", "json", "-c", command])
        return done.stdout, _json_count(done.stdout)

    def bpf() -> tuple[str, int]:
        command = " ".join(pinned([target, str(hits)], options.cpu))
        done = run([*PROBESCOPE, "count", spec, "--engine", "bpf", "-f", "json", "-c", command])
        if "aggregated in the kernel" not in done.stderr:
            raise RuntimeError(f"the bpf engine did not aggregate in the kernel: {done.stderr}")
        return done.stdout, _json_count(done.stdout)

    def ptrace() -> tuple[str, int]:
        command = f"{target} {slow_hits}"
        done = run([*PROBESCOPE, "count", spec, "--engine", "ptrace", "-f", "json", "-c", command])
        return done.stdout, _json_count(done.stdout)

    consumers: list[tuple[str, Callable[[], tuple[str, int]], int]] = [
        ("no probe", none, hits),
        ("probescope count (bpf, in the kernel)", bpf, hits),
        ("probescope count (tracefs, in place)", tracefs, hits),
        ("probescope count (ptrace)", ptrace, slow_hits),
    ]
    if shutil.which("bpftrace"):

        def bpftrace() -> tuple[str, int]:
            program = f"uprobe:{target}:probed {{ @[probe] = count(); }}"
            command = " ".join(pinned([target, str(hits)], options.cpu))
            done = run(["bpftrace", "-e", program, "-c", command])
            found = re.search(r"@\[[^\]]*\]: (\d+)", done.stdout)
            return done.stdout, int(found.group(1)) if found else -1

        consumers.append(("bpftrace count()", bpftrace, hits))
    rows = {name: Row(name) for name, _, _ in consumers}
    for _ in range(options.runs):
        for name, consume, expected in consumers:
            output, counted = consume()
            _, cost = per_call(output)
            if name != "no probe" and counted != expected:
                rows[name].note = f"counted {counted} of {expected} calls"
            rows[name].values.append(cost)
    rows_list = list(rows.values())
    rows_list.append(_funccount(target))
    return rows_list


def _json_count(stdout: str) -> int:
    import json

    for line in stdout.splitlines():
        if line.startswith('{"type": "map"'):
            data = json.loads(line)["data"]["@count"]
            return sum(data.values())
    return -1


def _funccount(target: str) -> Row:
    row = Row("bcc funccount")
    tool = shutil.which("funccount-bpfcc")
    if tool is None:
        row.note = "not installed (bpfcc-tools)"
        return row
    done = run(["timeout", "20", tool, "-d", "2", f"{target}:probed"])
    row.note = _bcc_failure(done) or "ran, but is not timed here"
    return row


def _bcc_failure(done: subprocess.CompletedProcess[str]) -> str | None:
    """Why a bcc tool failed (it can exit 0 after failing to compile its program)."""
    text = done.stdout + done.stderr
    for reason in ("Unable to find kernel headers", "Failed to compile BPF module"):
        if reason in text:
            return f"cannot run here: {reason.lower()} (bcc compiles against kernel headers)"
    if done.returncode:
        return "cannot run here: " + (text.strip().splitlines() or ["failed"])[-1][:120]
    return None


def print_part_a(rows: list[Row]) -> None:
    base = next(r for r in rows if r.name == "no probe").median
    reference = next((r for r in rows if r.name.startswith("bpftrace") and r.values), None)
    print("(a) cost per hit, counting hits by probe (ns per call in the traced program)")
    print(f"{'consumer':42} {'ns/call':>10} {'extra ns/hit':>13} {'vs bpftrace':>12}  note")
    for row in rows:
        if not row.values:
            print(f"{row.name:42} {'-':>10} {'-':>13} {'-':>12}  {row.note}")
            continue
        extra = row.median - base
        ratio = ""
        if reference is not None and row.name != "no probe":
            ratio = f"{extra / (reference.median - base):.2f}x"
        print(f"{row.name:42} {row.median:10.1f} {extra:13.1f} {ratio:>12}  {row.note}")


# --- (b) -----------------------------------------------------------------------------------


@dataclass
class Captured:
    layout: Any
    events: dict[int, tuple[Any, Any]]
    sub_buffers: list[tuple[int, bytes]]
    task_of: Callable[[int], tuple[str, int]]


def capture(options: Options, work: Path) -> Captured:
    binary = build(work)
    session = Session(
        [f"{binary}:probed x=arg1:s32"],
        engine="tracefs",
        command=pinned([str(binary), str(options.events)], options.cpu),
        options=EngineOptions(buffer_size_kb=65536),
    )
    sub_buffers: list[tuple[int, bytes]] = []
    with session:
        engine = session.engine
        layout, events = engine.record_layout()  # type: ignore[union-attr]
        for item in engine.sub_buffers():  # type: ignore[union-attr]
            if item is not None:
                sub_buffers.append(item)
        decoder = _decoder(layout, events)
        tids = {e.tid for cpu, data in sub_buffers for e in decoder.decode(data, cpu).events}
        names = {tid: engine.task_of(tid) for tid in tids}  # type: ignore[union-attr]
    return Captured(layout, events, sub_buffers, lambda tid: names.get(tid, ("<...>", tid)))


def _decoder(layout: Any, events: dict[int, tuple[Any, Any]]) -> EventDecoder:
    decoder = EventDecoder(layout)
    for event_format, event_type in events.values():
        decoder.add_event(event_format, event_type=event_type)
    return decoder


def part_b(options: Options, work: Path) -> list[Row]:
    captured = capture(options, work)
    layout, events = captured.layout, captured.events

    def in_place(
        fields: tuple[str, ...], of: str | None = None, *, runs: bool = True
    ) -> Callable[[], int]:
        def go() -> int:
            aggregator = RecordAggregator(
                "@m", KeyPlan(fields), layout, events, of=of, task_of=captured.task_of
            )
            if not runs:
                aggregator._uniform_run = lambda data, cpu: None  # type: ignore[method-assign]
            for cpu, data in captured.sub_buffers:
                aggregator.feed(data, cpu)
            return sum(aggregator.snapshot().first.counts().values())

        return go

    def decoder() -> EventDecoder:
        return _decoder(layout, events)

    def event_path() -> int:
        aggregator = EventAggregator("@m", KeyPlan(("probe",)))
        decode = decoder().decode
        for cpu, data in captured.sub_buffers:
            aggregator.add_batch(decode(data, cpu))
        return sum(aggregator.snapshot().first.counts().values())

    def decode_only() -> int:
        decode = decoder().decode
        return sum(len(decode(data, cpu)) for cpu, data in captured.sub_buffers)

    cases = [
        ("count by probe, in place", in_place(("probe",))),
        ("count by probe, argument, in place", in_place(("probe", "x"))),
        ("count by pid, comm, in place", in_place(("pid", "comm"))),
        ("log2 histogram of the argument, in place", in_place((), "x")),
        ("count by probe, record by record (no C runs)", in_place(("probe",), runs=False)),
        ("count by probe, decoder + event path", event_path),
        ("decode into Events only (reference)", decode_only),
    ]
    rows = []
    for name, case in cases:
        row = Row(name)
        for _ in range(options.runs):
            start = time.perf_counter()
            counted = case()
            elapsed = time.perf_counter() - start
            row.values.append(counted / elapsed)
        row.note = f"{counted} events"
        rows.append(row)
    return rows


def print_part_b(rows: list[Row]) -> None:
    print("(b) user-space aggregation from captured sub-buffers (target >= 2 M events/s)")
    print(f"{'case':44} {'M events/s':>11}  note")
    for row in rows:
        print(f"{row.name:44} {row.median / 1e6:11.2f}  {row.note}")


# --- (c) -----------------------------------------------------------------------------------


def part_c(options: Options, work: Path) -> list[Row]:
    binary = build(work)
    target = str(binary)
    command = f"{target} 10"
    ours = [*PROBESCOPE, "latency", f"{target}:probed", "-q", "-c", command]
    tools: list[tuple[str, list[str]]] = [
        ("probescope latency (bpf, in the kernel)", [*ours, "--engine", "bpf"]),
        ("probescope latency (tracefs)", [*ours, "--engine", "tracefs"]),
    ]
    if shutil.which("bpftrace"):
        program = (
            f"uprobe:{target}:probed {{ @s[tid] = nsecs; }} "
            f"uretprobe:{target}:probed /@s[tid]/ "
            "{ @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }"
        )
        tools.append(("bpftrace entry/return hist", ["bpftrace", "-e", program, "-c", command]))
    rows = []
    for name, argv in tools:
        row = Row(name)
        for _ in range(options.runs):
            start = time.monotonic_ns()
            done = run(argv)
            found = re.search(r"main (\d+)", done.stdout)
            if found is None:
                row.note = f"failed: {done.stderr.strip()[-120:]}"
                break
            row.values.append((int(found.group(1)) - start) / 1e6)
        rows.append(row)
    funclatency = Row("bcc funclatency")
    tool = shutil.which("funclatency-bpfcc")
    if tool is None:
        funclatency.note = "not installed (bpfcc-tools)"
    else:
        done = run(["timeout", "20", tool, "-d", "1", f"{target}:probed"])
        funclatency.note = _bcc_failure(done) or "ran, but is not timed here"
    rows.append(funclatency)
    return rows


def print_part_c(rows: list[Row]) -> None:
    print("(c) start-up: launch to the traced command's main, probes armed (ms)")
    reference = next((r for r in rows if r.name.startswith("bpftrace") and r.values), None)
    for row in rows:
        if not row.values:
            print(f"{row.name:42} {'-':>9}  {row.note}")
            continue
        ratio = f"{row.median / reference.median:.2f}x bpftrace" if reference else ""
        print(f"{row.name:42} {row.median:9.1f}  {ratio} {row.note}")


# --- main ----------------------------------------------------------------------------------

PARTS: dict[str, tuple[Callable[[Options, Path], list[Row]], Callable[[list[Row]], None]]] = {
    "a": (part_a, print_part_a),
    "b": (part_b, print_part_b),
    "c": (part_c, print_part_c),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="a,b,c", help="comma-separated parts to run")
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians printed)")
    parser.add_argument("--hits", type=int, default=1_000_000, help="(a) calls per run")
    parser.add_argument("--ptrace-hits", type=int, default=100_000, help="(a) calls, ptrace")
    parser.add_argument("--events", type=int, default=1_000_000, help="(b) events captured")
    parser.add_argument("--cpu", type=int, default=0, help="the target's CPU")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_aggregate needs root (tracefs, bpftrace)", file=sys.stderr)
        return 2
    options = Options(
        [p for p in args.parts.split(",") if p],
        args.runs,
        args.hits,
        args.ptrace_hits,
        args.events,
        args.cpu,
    )
    with tempfile.TemporaryDirectory(prefix="probescope-bench-aggregate-") as directory:
        for part in options.parts:
            measure, show = PARTS[part]
            show(measure(options, Path(directory)))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
