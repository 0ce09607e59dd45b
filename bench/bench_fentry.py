"""Benchmark: the fentry engine against its peers, in one run (issue 15's targets).

Run: `.venv/bin/python bench/bench_fentry.py [--runs R] [--quick]` (root: the kernel's uprobes
and bpftrace need it; without root those peers are skipped).

1. Cost per hit. A program calls `hit(n)` in a loop and times the loop itself
   (clock_gettime around it, so start-up and attach cancel out), twice per run: a tight loop
   (`hit` returns at once) and a loop with ~60 ns of work in `hit`. The cost per hit is the
   traced loop's ns per call minus the untraced one's. Peers on the same sites:
   - fentry, entry probe and entry+return, on an ordinary build (`hit` starts with a
     single-stepped instruction for the kernel: a detour for fentry) and on a `-pg -mfentry
     -mnop-mcount` build (a 5-byte nop at the entry: an fentry nop site, which Linux 6.18
     optimizes into a call for its own uprobes);
   - the kernel's uprobe through tracefs (a private instance) on both sites;
   - BPF: the bpf engine (same probe, its records into a BPF ring buffer) and bpftrace
     `count()` on the same uprobe;
   - the ptrace engine (far fewer hits: ~20 µs each);
   - uftrace 0.13 recording a `-pg` build of the same program (`-F hit`).
   Each fentry run checks that every hit was recorded (0 lost: the ring holds them all and is
   drained after the program ends, so the loop times the stubs, not a drain competing for the
   CPUs; section 3 measures the drain).
2. Attach and detach of 1,000 sites in a running program (detours, and nop sites of a
   `-fpatchable-function-entry=5` build), beside the ptrace engine's.
3. Sustained drain: the program calls `hit` at a paced rate for 3 s under
   `probescope trace --engine fentry -f jsonl -o FILE`; the highest rate with 0 lost.
Ratios are printed against fentry, with the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from probescope.engines.base import Target
from probescope.engines.fentry.engine import FentryEngine
from probescope.engines.ptrace import PtraceEngine
from probescope.events import EventBatch
from probescope.session import Session
from probescope.symbols.table import SymbolTable

ROUNDS = 5
PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long hit(long n)
{
#ifdef WORK
    unsigned long h = n;
    for (int i = 0; i < 24; i++)
        h = (h ^ (h >> 7)) * 0x100000001b3UL;
    return (long)h;
#else
    return n + 1;
#endif
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long calls = atol(argv[1]);
    int rounds = argc > 2 ? atoi(argv[2]) : 1;
    double pause = argc > 3 ? atof(argv[3]) : 0;
    volatile long sum = 0;
    for (int r = 0; r < rounds; r++) {
        double start = now();
        for (long i = 0; i < calls; i++)
            sum += hit(i);
        double ns = now() - start;
        printf("%.3f\n", ns / (calls ? calls : 1));
        fflush(stdout);
        if (pause > 0)
            usleep((useconds_t)(pause * 1e6));
    }
    return 0;
}
"""

FLOOR = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* What every hit has to do at least: take a ticket with lock cmpxchg, read the TSC and the
   CPU, fill a 128-byte record in a populated shared ring, commit it. */
int main(int argc, char **argv)
{
    long calls = atol(argv[1]), slots = 1 << 17;
    int rounds = atoi(argv[2]);
    unsigned long *ring = mmap(0, slots * 128, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    static unsigned long head;
    for (int r = 0; r < rounds; r++) {
        double start = now();
        for (long i = 0; i < calls; i++) {
            unsigned long ticket = head, next;
            do
                next = ticket + 1;
            while (!__atomic_compare_exchange_n(&head, &ticket, next, 0, __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST));
            unsigned long *record = ring + (ticket % slots) * 16, cpu;
            unsigned lo, hi;
            __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
            __asm__ volatile("rdpid %0" : "=r"(cpu));
            record[1] = i;
            record[2] = lo | (unsigned long)hi << 32;
            record[3] = cpu;
            for (int w = 4; w < 16; w++)
                record[w] = i + w;
            __atomic_store_n((unsigned *)record, (unsigned)(ticket + 1), __ATOMIC_RELEASE);
        }
        printf("%.3f\n", (now() - start) / calls);
    }
    return 0;
}
"""

PACED = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) long hit(long n) { return n + 1; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    volatile long sum = 0;
    long done = 0;
    double start = now();
    for (;;) {
        double t = now() - start;
        if (t >= seconds)
            break;
        long due = (long)(t * rate);
        while (done < due)
            sum += hit(done++);
    }
    printf("%ld\n", done);
    return 0;
}
"""


def build(workdir: Path) -> dict[str, Path]:
    source = workdir / "loop.c"
    source.write_text(PROGRAM)
    out = {}
    variants = {
        "plain": ["-O2"],
        "plain_work": ["-O2", "-DWORK"],
        "nop5": ["-O2", "-pg", "-mfentry", "-mnop-mcount", "-mrecord-mcount", "-fno-pie",
                 "-no-pie"],
        "nop5_work": ["-O2", "-DWORK", "-pg", "-mfentry", "-mnop-mcount", "-mrecord-mcount",
                      "-fno-pie", "-no-pie"],
        "uftrace": ["-O2", "-pg"],
        "uftrace_work": ["-O2", "-DWORK", "-pg"],
    }  # fmt: skip
    for name, flags in variants.items():
        path = workdir / name
        if "-pg" in flags and "-mnop-mcount" in flags:
            # compiled with -pg, linked without it (no gcrt1 profiling timer)
            subprocess.run(["gcc", *flags, "-c", "-o", f"{path}.o", str(source)], check=True)
            subprocess.run(["gcc", "-no-pie", "-o", str(path), f"{path}.o"], check=True)
        else:
            subprocess.run(["gcc", *flags, "-o", str(path), str(source)], check=True)
        out[name] = path
    for name, text in (("paced", PACED), ("floor", FLOOR)):
        (workdir / f"{name}.c").write_text(text)
        built = workdir / name
        subprocess.run(["gcc", "-O2", "-o", str(built), str(workdir / f"{name}.c")], check=True)
        out[name] = built
    return out


def first_instruction(path: Path) -> str:
    import capstone  # type: ignore[import-untyped]

    function = SymbolTable.for_path(path).lookup("hit")
    data = path.read_bytes()[function.offset : function.offset + 16]
    insn = next(capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64).disasm(data, 0))
    return f"{insn.mnemonic} {insn.op_str}".strip()


def loop_ns(output: str) -> float:
    """Median ns per call over the rounds the program printed (the first round warms up)."""
    values = [float(line) for line in output.split() if re.fullmatch(r"[0-9.]+", line)]
    return statistics.median(values[1:] if len(values) > 2 else values)


def plain_run(argv: list[str]) -> float:
    # in the program's own directory: a -pg build run without uftrace writes gmon.out there
    workdir = os.path.dirname(argv[0])
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=workdir)
    return loop_ns(done.stdout)


def fentry_run(program: Path, specs: list[str], calls: int, expect_events: int) -> float:
    """The program's loop under fentry. The ring holds every record and is drained only once
    the program ended: the loop measures the stubs, not a drain competing for the CPUs
    (section 3 measures the drain)."""
    engine = FentryEngine(buffer_size_kb=256 * 1024)
    probes = Session(specs).probes
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            engine.attach(probes, Target(command=(str(program), str(calls), str(ROUNDS))))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        while engine.exit_code is None:
            time.sleep(0.05)
        events = 0
        for item in engine.events():
            if isinstance(item, EventBatch):
                events += len(item.events)
        stats = engine.stats()
        out.seek(0)
        text = out.read()
    if stats.lost or events != expect_events:
        print(f"  (fentry recorded {events} of {expect_events} events, lost {stats.lost})")
    return loop_ns(text)


def bpf_run(program: Path, specs: list[str], calls: int) -> float | None:
    """The program's loop under the bpf engine (uprobe_multi, records into a BPF ring buffer)."""
    from probescope.engines.registry import BY_NAME, availability, create_engine

    if not availability(BY_NAME["bpf"]).ok:
        return None
    engine = create_engine("bpf")
    probes = Session(specs).probes
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            engine.attach(probes, Target(command=(str(program), str(calls), str(ROUNDS))))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        for _ in engine.events():
            pass
        engine.detach()
        out.seek(0)
        return loop_ns(out.read())


def ptrace_run(program: Path, specs: list[str], calls: int) -> float:
    engine = PtraceEngine()
    probes = Session(specs).probes
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            engine.attach(probes, Target(command=(str(program), str(calls), "3")))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        for _ in engine.events():
            pass
        out.seek(0)
        return loop_ns(out.read())


class KernelUprobe:
    """The kernel's uprobe on `hit` through a private tracefs instance."""

    root = Path("/sys/kernel/tracing")

    def __init__(self, program: Path) -> None:
        self.program = program
        self.offset = SymbolTable.for_path(program).lookup("hit").offset
        self.group = f"probescope_bench_fentry_{os.getpid()}"

    @classmethod
    def usable(cls) -> bool:
        return os.geteuid() == 0 and (cls.root / "uprobe_events").exists()

    def _append(self, path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def run(self, argv: list[str]) -> float:
        instance = self.root / "instances" / self.group.replace("_", "-")
        instance.mkdir()
        self._append(
            self.root / "dynamic_events",
            f"p:{self.group}/hit {self.program}:0x{self.offset:x} n=%di\n",
        )
        enable = instance / "events" / self.group / "enable"
        try:
            (instance / "buffer_size_kb").write_text("16384")
            enable.write_text("1")
            return plain_run(argv)
        finally:
            enable.write_text("0")
            instance.rmdir()
            self._append(self.root / "dynamic_events", f"-:{self.group}/hit\n")


def bpftrace_run(program: Path, argv: list[str]) -> float | None:
    if not shutil.which("bpftrace") or os.geteuid() != 0:
        return None
    tracer = subprocess.Popen(
        ["bpftrace", "-e", f"uprobe:{program}:hit {{ @calls = count(); }}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert tracer.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while "Attaching" not in line and time.monotonic() < deadline:
            line = tracer.stdout.readline()
        time.sleep(0.5)
        return plain_run(argv)
    finally:
        tracer.terminate()
        tracer.wait()


def uftrace_run(program: Path, calls: int, workdir: Path) -> float | None:
    if not shutil.which("uftrace"):
        return None
    data = workdir / "uftrace.data"
    done = subprocess.run(
        ["uftrace", "record", "-d", str(data), "-F", "hit", str(program), str(calls),
         str(ROUNDS)],
        capture_output=True, text=True, check=True, cwd=workdir,
    )  # fmt: skip
    shutil.rmtree(data, ignore_errors=True)
    return loop_ns(done.stdout)


# ---------------------------------------------------------------------------------------------
# attach/detach of 1,000 sites


def many_functions(workdir: Path, count: int, flags: list[str], name: str) -> Path:
    lines = ["#include <stdio.h>", "#include <unistd.h>"]
    lines += [f"__attribute__((noinline)) int f{i}(int x) {{ return x * {i} + 1; }}"
              for i in range(count)]  # fmt: skip
    calls = " + ".join(f"f{i}(x)" for i in range(0, count, 97))
    lines.append("int main(void) { volatile int x = 1; int s = 0; for (;;) { s += " + calls
                 + "; if (getchar() == EOF) break; } return s & 1; }")  # fmt: skip
    source = workdir / f"{name}.c"
    source.write_text("\n".join(lines))
    path = workdir / name
    subprocess.run(["gcc", *flags, "-o", str(path), str(source)], check=True)
    return path


def attach_detach(
    engine_factory: Callable[[], object], program: Path, count: int
) -> tuple[float, float]:
    process = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    time.sleep(0.2)
    probes = Session([f"{program}:f{i}" for i in range(count)]).probes
    try:
        engine = engine_factory()
        started = time.perf_counter()
        engine.attach(probes, Target(pids=(process.pid,)))  # type: ignore[attr-defined]
        attached = time.perf_counter()
        if isinstance(engine, PtraceEngine):
            events = engine.events()
            next(events)
            engine.detach()
        else:
            engine.detach()  # type: ignore[attr-defined]
        detached = time.perf_counter()
        return attached - started, detached - attached
    finally:
        process.stdin.close()  # type: ignore[union-attr]
        process.wait()


# ---------------------------------------------------------------------------------------------
# sustained drain


def drain_run(paced: Path, rate: int, seconds: float, workdir: Path) -> tuple[int, int, int]:
    """(calls made, events written, lost) for `paced` at `rate` calls/s into jsonl."""
    output = workdir / "drain.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "probescope", "trace", "--engine", "fentry", "-f", "jsonl",
         "-o", str(output), "-c", f"{paced} {rate} {seconds}", f"{paced}:hit n=arg1:s64"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    calls = int(done.stdout.split()[0]) if done.stdout.split() else 0
    with open(output) as f:
        events = sum(1 for _ in f)
    lost_match = re.search(r"lost (\d+)", done.stderr)
    output.unlink()
    return calls, events, int(lost_match.group(1)) if lost_match else -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200_000, help="calls per timed round")
    parser.add_argument("--quick", action="store_true", help="fewer peers and drain rates")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="probescope-bench-fentry-"))
    try:
        return run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, workdir: Path) -> int:
    programs = build(workdir)
    calls = args.calls
    runs = args.runs

    def median(measure: Callable[..., float | None], *arguments: object) -> float | None:
        values = [v for v in (measure(*arguments) for _ in range(runs)) if v is not None]
        return statistics.median(values) if values else None

    table: dict[str, dict[str, float | None]] = {}
    instructions: dict[str, str] = {}
    argv = [str(calls), str(ROUNDS)]
    for loop in ("tight", "work"):
        suffix = "" if loop == "tight" else "_work"
        plain, nop5 = programs["plain" + suffix], programs["nop5" + suffix]
        base = median(plain_run, [str(plain), *argv])
        base_nop5 = median(plain_run, [str(nop5), *argv])
        assert base is not None and base_nop5 is not None
        row: dict[str, float | None] = {}
        for site, program, baseline in (("detour", plain, base), ("nop5", nop5, base_nop5)):
            entry = [f"{program}:hit n=arg1:s64"]
            both = [*entry, f"r:{program}:hit r=retval:s64"]
            row[f"fentry entry ({site})"] = _minus(
                median(fentry_run, program, entry, calls, calls * ROUNDS), baseline
            )
            row[f"fentry entry+return ({site})"] = _minus(
                median(fentry_run, program, both, calls, 2 * calls * ROUNDS), baseline
            )
            if KernelUprobe.usable():
                kernel = KernelUprobe(program)
                name = f"kernel uprobe ({site} site)"
                instructions[site] = first_instruction(program)
                row[name] = _minus(median(kernel.run, [str(program), *argv]), baseline)
            row[f"bpf engine entry ({site} site)"] = _minus(
                median(bpf_run, program, entry, calls), baseline
            )
            if not args.quick:
                row[f"bpftrace count() ({site} site)"] = _minus(
                    median(bpftrace_run, program, [str(program), *argv]), baseline
                )
        few = max(200, calls // 200)
        row["ptrace engine entry (detour site)"] = _minus(
            median(ptrace_run, plain, [f"{plain}:hit n=arg1:s64"], few), base
        )
        uftraced = programs["uftrace" + suffix]
        uftrace_base = median(plain_run, [str(uftraced), *argv])
        assert uftrace_base is not None
        row["uftrace record -F hit (-pg build; entry+exit)"] = _minus(
            median(uftrace_run, uftraced, calls, workdir), uftrace_base
        )
        if loop == "tight":
            row["(floor: lock cmpxchg + rdtsc + rdpid + 128 B record, in C)"] = median(
                plain_run, [str(programs["floor"]), str(calls), str(ROUNDS)]
            )
        else:
            row["(floor: lock cmpxchg + rdtsc + rdpid + 128 B record, in C)"] = None
        row["(untraced loop, ns per call)"] = base
        table[loop] = row

    print(
        f"\n1. cost per hit (ns), {calls} calls x {ROUNDS} rounds, median of {runs} runs; "
        f"{os.cpu_count()} CPUs\n"
    )
    print(f"first instructions of hit(): {instructions}\n")
    print(f"{'tracer':58} {'tight':>9} {'~60 ns work':>12}   ÷ fentry entry (tight)")
    reference = table["tight"]["fentry entry (detour)"] or 1.0
    for name in table["tight"]:
        tight, work = table["tight"][name], table["work"][name]
        ratio = "" if tight is None or name.startswith("(") else f"{tight / reference:9.1f}x"
        print(f"{name:58} {_fmt(tight):>9} {_fmt(work):>12}   {ratio}")
    _targets(table["tight"])

    print("\n2. attach + detach of 1,000 sites in a running program (s)\n")
    detours = many_functions(workdir, 1000, ["-O0"], "many")
    nops = many_functions(workdir, 1000, ["-O0", "-fpatchable-function-entry=5"], "many_nop")
    for label, program, factory in (
        ("fentry, detours", detours, FentryEngine),
        ("fentry, nop sites", nops, FentryEngine),
        ("ptrace engine (int3)", detours, PtraceEngine),
    ):
        first = attach_detach(factory, program, 1000)
        samples = [attach_detach(factory, program, 1000) for _ in range(runs)]
        attach = statistics.median(s[0] for s in samples)
        detach = statistics.median(s[1] for s in samples)
        print(
            f"{label:22} first: attach {first[0]:6.3f} detach {first[1]:6.3f} | then: attach "
            f"{attach:6.3f} detach {detach:6.3f} total {attach + detach:6.3f}"
        )
    print(
        "(first: the functions are planned — decoded, refusal rules checked; then: plans kept "
        "per file)\ntarget: fentry attach + detach of 1,000 sites <= 0.2 s"
    )

    print("\n3. sustained drain into jsonl (probescope trace -f jsonl -o FILE), 3 s per rate\n")
    rates = (
        [100_000, 200_000, 400_000, 1_000_000]
        if args.quick
        else [100_000, 150_000, 200_000, 250_000, 300_000, 500_000, 1_000_000, 2_000_000]
    )
    best = 0
    for rate in rates:
        made, written, lost = drain_run(programs["paced"], rate, 3.0, workdir)
        print(f"{rate:>10,} calls/s: {made:>10,} calls, {written:>10,} events written, lost {lost}")
        if lost == 0 and written == made:
            best = rate
    print(f"highest rate with 0 lost: {best:,} events/s")
    print(json.dumps({"tight": table["tight"], "work": table["work"], "drain_best": best}))
    return 0


def _minus(value: float | None, baseline: float) -> float | None:
    return None if value is None else value - baseline


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _targets(row: dict[str, float | None]) -> None:
    entry = row.get("fentry entry (nop5)")
    detour = row.get("fentry entry (detour)")
    both = row.get("fentry entry+return (detour)")
    kernel = next((v for k, v in row.items() if k.startswith("kernel uprobe (nop5")), None)
    uftrace = row.get("uftrace record -F hit (-pg build; entry+exit)")
    print("\ntargets (tight loop):")
    print(f"  entry <= 20 ns: nop5 site {_fmt(entry)} ns, detour {_fmt(detour)} ns")
    print(f"  entry+return <= 40 ns: {_fmt(both)} ns")
    if kernel and entry:
        ratio = kernel / entry
        print(f"  >= 30x cheaper than the kernel's uprobe on the same nop5 site: {ratio:.0f}x")
    if uftrace and both:
        print(
            f"  >= 3x cheaper than uftrace (entry+return vs its entry+exit): {uftrace / both:.1f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
