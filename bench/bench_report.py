"""Benchmark of `probescope report FILE` (text) against `trace-cmd report FILE`, one run.

Run: `.venv/bin/python bench/bench_report.py [--file FILE] [--calls N] [--runs R]`.

Without `--file` it records (as root, the tracefs engine) a C target calling `work(i)` N times
with a uprobe and a uretprobe on it — 2N events — into /dev/shm, or reuses that recording when
it is there. Then, R times each on the same file: `probescope report` through its compiled loop,
`probescope report` in pure Python (`PROBESCOPE_NO_ACCEL=1`), `trace-cmd report`; printed:
median wall seconds, events/s, and probescope's speed over trace-cmd's. The two probescope runs
must print the same bytes (checked here too). Start-up (~0.15 s of Python imports) is included,
as a user pays it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = r"""
#include <stdlib.h>
__attribute__((noinline)) long work(long i) { __asm__ volatile("" ::: "memory"); return 2 * i; }
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 300000, total = 0;
    for (long i = 0; i < n; i++)
        total += work(i);
    return (int)(total & 1);
}
"""
DISABLE = "PROBESCOPE_NO_ACCEL"


def record(out: Path, calls: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        source, binary = work / "target.c", work / "target"
        source.write_text(TARGET)
        subprocess.run(["gcc", "-O1", "-o", str(binary), str(source)], check=True)
        subprocess.run(
            [
                sys.executable, "-m", "probescope", "record", "-q", "--engine", "tracefs",
                "-o", str(out), "-c", f"{binary} {calls}",
                f"{binary}:work i=arg1:s64", f"r:{binary}:work ret=retval:s64",
            ],
            check=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of one run with its output to a file, and the output's digest."""
    with tempfile.TemporaryFile() as sink:
        start = time.perf_counter()
        subprocess.run(argv, stdout=sink, stderr=subprocess.DEVNULL, env=env, check=True)
        seconds = time.perf_counter() - start
        sink.seek(0)
        return seconds, hashlib.sha256(sink.read()).hexdigest()


def events_in(path: Path) -> int:
    summary = subprocess.run(
        [sys.executable, "-m", "probescope", "report", "-o", os.devnull, str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found = re.search(r"probescope: (\d+) events", summary)
    if not found:
        raise RuntimeError(f"no event count in {summary!r}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, help="a recording (default: made once in /dev/shm)")
    parser.add_argument("--calls", type=int, default=300000, help="calls of work() to record")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    path = args.file or Path(f"/dev/shm/probescope-bench-report-{args.calls}.dat")
    if not path.exists():
        if args.file:
            parser.error(f"{path} does not exist")
        print(f"recording {args.calls} calls into {path} ...")
        record(path, args.calls)
    events = events_in(path)
    base = {k: v for k, v in os.environ.items() if k != DISABLE}
    ours = [sys.executable, "-m", "probescope", "report", "-q", str(path)]
    runs: dict[str, tuple[list[str], dict[str, str]]] = {
        "probescope report (compiled)": (ours, base),
        "probescope report (pure Python)": (ours, {**base, DISABLE: "1"}),
    }
    tool = shutil.which("trace-cmd")
    if tool:
        runs["trace-cmd report"] = ([tool, "report", str(path)], base)
    medians: dict[str, float] = {}
    digests: dict[str, set[str]] = {}
    for name, (argv, env) in runs.items():
        results = [timed(argv, env) for _ in range(args.runs)]
        medians[name] = statistics.median(seconds for seconds, _ in results)
        digests[name] = {digest for _, digest in results}
    size = path.stat().st_size / 1e6
    print(f"{path}: {events} events, {size:.1f} MB, median of {args.runs} runs")
    print(f"{'reader':<34} {'seconds':>8} {'events/s':>12}")
    for name, seconds in medians.items():
        print(f"{name:<34} {seconds:>8.3f} {events / seconds:>12.0f}")
    compiled, python = (medians[name] for name in list(runs)[:2])
    same = digests["probescope report (compiled)"] == digests["probescope report (pure Python)"]
    print(f"compiled / pure Python: x{python / compiled:.2f} (same bytes: {same})")
    if tool:
        theirs = medians["trace-cmd report"]
        print(f"probescope report / trace-cmd report: x{theirs / compiled:.2f} (target >= 1)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
