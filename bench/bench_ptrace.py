"""Benchmark: cost per probe hit of the ptrace engine against its peers, in one run.

Run: `.venv/bin/python bench/bench_ptrace.py [--hits N] [--runs R]`. A program calls
`hit(int n, const char *s)` in a shared library N times; every tracer records each call with
its two arguments:

- probescope ptrace engine: entry probe `n=%di s=+0(%si):string`, entry+return (adds
  `$retval`), the kernel-style single-step mode, and unpinned (tracer and tracee free to run on
  different CPUs);
- gdb 13 with `dprintf hit,"%d %s\\n",n,s` (as run, and pinned with taskset);
- ltrace `-e hit` on the library call (as run, and pinned);
- a naive ptrace tracer in C, compiled here: int3, restore the byte, single-step, re-insert
  (pinned and unpinned);
- a kernel uprobe through tracefs (a private instance; root only), same fetchargs.

Each tool runs once with N hits and once with 0 hits; the difference divided by N is its cost
per hit, so start-up (gdb reading symbols, Python importing) cancels out. Medians of R runs.
Ratios are printed against probescope's entry probe. The engine's stops per hit come from its
own counters.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from probescope.engines.base import Target
from probescope.engines.ptrace import PtraceEngine
from probescope.events import EventBatch
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe

LIBRARY = r"""
__attribute__((noinline)) int hit(int n, const char *s) { return n + s[0]; }
"""

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
int hit(int n, const char *s);
int main(int argc, char **argv)
{
    int n = atoi(argv[1]);
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += hit(i, "payload");
    printf("%ld\n", sum);
    return 0;
}
"""

# The textbook breakpoint loop: TRACEME, int3, on a hit restore the byte, back up ip,
# single-step, put the int3 back. It reads the same registers the others read.
NAIVE = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long address_of(pid_t pid, const char *path, unsigned long offset)
{
    char name[64], line[512], perms[8], file[400];
    unsigned long start, end, off;
    snprintf(name, sizeof name, "/proc/%d/maps", pid);
    FILE *maps = fopen(name, "r");
    while (fgets(line, sizeof line, maps)) {
        file[0] = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %399s", &start, &end, perms, &off, file) < 4)
            continue;
        if (strcmp(file, path) == 0 && perms[2] == 'x' && off <= offset
            && offset < off + (end - start)) {
            fclose(maps);
            return start + offset - off;
        }
    }
    fclose(maps);
    return 0;
}

static long insert(pid_t pid, unsigned long at)
{
    long word = ptrace(PTRACE_PEEKTEXT, pid, at, 0);
    ptrace(PTRACE_POKETEXT, pid, at, (word & ~0xffL) | 0xcc);
    return word;
}

int main(int argc, char **argv)
{
    /* naive EXE MAIN_OFFSET LIB LIB_OFFSET -- PROGRAM ARGS */
    const char *exe = argv[1], *lib = argv[3];
    unsigned long main_offset = strtoul(argv[2], 0, 0), hit_offset = strtoul(argv[4], 0, 0);
    pid_t pid = fork();
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        execv(argv[6], argv + 6);
        _exit(127);
    }
    int status;
    struct user_regs_struct regs;
    waitpid(pid, &status, 0); /* the exec SIGTRAP */
    unsigned long main_at = address_of(pid, exe, main_offset);
    long saved = insert(pid, main_at);
    ptrace(PTRACE_CONT, pid, 0, 0);
    waitpid(pid, &status, 0);
    ptrace(PTRACE_POKETEXT, pid, main_at, saved);
    ptrace(PTRACE_GETREGS, pid, 0, &regs);
    regs.rip = main_at;
    ptrace(PTRACE_SETREGS, pid, 0, &regs);
    unsigned long at = address_of(pid, lib, hit_offset);
    saved = insert(pid, at);
    long hits = 0, sum = 0;
    for (;;) {
        ptrace(PTRACE_CONT, pid, 0, 0);
        waitpid(pid, &status, 0);
        if (WIFEXITED(status) || WIFSIGNALED(status))
            break;
        ptrace(PTRACE_GETREGS, pid, 0, &regs);
        if (WSTOPSIG(status) != SIGTRAP || regs.rip != at + 1) {
            ptrace(PTRACE_CONT, pid, 0, WSTOPSIG(status));
            continue;
        }
        hits++;
        sum += regs.rdi + (ptrace(PTRACE_PEEKDATA, pid, regs.rsi, 0) & 0xff);
        ptrace(PTRACE_POKETEXT, pid, at, saved);
        regs.rip = at;
        ptrace(PTRACE_SETREGS, pid, 0, &regs);
        ptrace(PTRACE_SINGLESTEP, pid, 0, 0);
        waitpid(pid, &status, 0);
        insert(pid, at);
    }
    fprintf(stderr, "naive hits=%ld sum=%ld\n", hits, sum);
    return 0;
}
"""


def build(workdir: Path) -> tuple[Path, Path, Path]:
    library = workdir / "libbenchhit.so"
    program = workdir / "benchmain"
    naive = workdir / "naive-tracer"
    (workdir / "lib.c").write_text(LIBRARY)
    (workdir / "main.c").write_text(PROGRAM)
    (workdir / "naive.c").write_text(NAIVE)
    gcc = ["gcc", "-O2", "-g"]
    subprocess.run(
        [*gcc, "-shared", "-fPIC", "-o", str(library), str(workdir / "lib.c")], check=True
    )
    subprocess.run(
        [
            *gcc,
            "-o",
            str(program),
            str(workdir / "main.c"),
            f"-L{workdir}",
            "-lbenchhit",
            f"-Wl,-rpath,{workdir}",
        ],
        check=True,
    )
    subprocess.run([*gcc, "-o", str(naive), str(workdir / "naive.c")], check=True)
    return library, program, naive


def file_offset(path: Path, name: str) -> int:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for table in (".symtab", ".dynsym"):
            section = elf.get_section_by_name(table)
            if not isinstance(section, SymbolTableSection):
                continue
            for symbol in section.iter_symbols():
                if symbol.name == name and symbol["st_value"]:
                    value = symbol["st_value"]
                    for seg in elf.iter_segments():
                        if seg["p_type"] == "PT_LOAD" and (
                            seg["p_vaddr"] <= value < seg["p_vaddr"] + seg["p_filesz"]
                        ):
                            return int(value - seg["p_vaddr"] + seg["p_offset"])
    raise LookupError(name)


def first_instruction(path: Path, offset: int) -> str:
    import capstone  # type: ignore[import-untyped]

    data = path.read_bytes()[offset : offset + 16]
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    insn = next(md.disasm(data, 0))
    return f"{insn.mnemonic} {insn.op_str}".strip()


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


class Measure:
    """Median cost per hit of one tool: (time with N hits - time with 0 hits) / N."""

    def __init__(self, hits: int, runs: int) -> None:
        self.hits = hits
        self.runs = runs

    def per_hit(self, run: Callable[[int], float]) -> float:
        samples = []
        for _ in range(self.runs):
            full = run(self.hits)
            empty = run(0)
            samples.append((full - empty) / self.hits)
        return statistics.median(samples)


def probe(text: str) -> ResolvedProbe:
    spec = parse_kernel_probe(text)
    assert isinstance(spec, ProbeSpec)
    return ResolvedProbe.from_uprobe_spec(spec)


def engine_run(
    program: Path,
    probes: list[ResolvedProbe],
    engine_options: dict[str, object],
    stops: list[float],
    hits: int,
) -> float:
    engine = PtraceEngine(**engine_options)  # type: ignore[arg-type]
    started = time.perf_counter()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1)
    os.dup2(devnull, 1)
    try:
        engine.attach(probes, Target(command=(str(program), str(hits))))
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
    events = 0
    for item in engine.events():
        if not isinstance(item, EventBatch):
            events += 1
    elapsed = time.perf_counter() - started
    extra = engine.stats().extra
    if hits:
        expected = hits * (len(probes))
        assert events == expected, (events, expected)
        stops.append((extra["stops"]) / hits)
    return elapsed


def tracefs_run(library: Path, offset: int, program: Path) -> Callable[[int], float] | None:
    root = Path("/sys/kernel/tracing")
    if os.geteuid() != 0 or not (root / "uprobe_events").exists():
        return None
    group = f"probescope_bench_ptrace_{os.getpid()}"
    instance = root / "instances" / group.replace("_", "-")

    def append(path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def run(hits: int) -> float:
        instance.mkdir()
        append(
            root / "dynamic_events",
            f"p:{group}/hit {library}:0x{offset:x} n=%di:s32 s=+0(%si):string\n",
        )
        try:
            (instance / "buffer_size_kb").write_text("8192")
            (instance / "events" / group / "enable").write_text("1")
            elapsed = timed([str(program), str(hits)])
            (instance / "events" / group / "enable").write_text("0")
            return elapsed
        finally:
            enable = instance / "events" / group / "enable"
            if enable.exists():
                enable.write_text("0")
            instance.rmdir()
            append(root / "dynamic_events", f"-:{group}/hit\n")

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hits", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cpu = min(os.sched_getaffinity(0))
    workdir = Path(tempfile.mkdtemp(prefix="probescope-bench-ptrace-"))
    probed = "?"
    results: dict[str, float] = {}
    stops: dict[str, list[float]] = {}
    try:
        library, program, naive = build(workdir)
        offset = file_offset(library, "hit")
        probed = first_instruction(library, offset)
        main_offset = file_offset(program, "main")
        measure = Measure(args.hits, args.runs)
        entry = probe(f"p:bench/hit {library}:0x{offset:x} n=%di:s32 s=+0(%si):string")
        ret = probe(f"r:bench/hit_ret {library}:0x{offset:x} r=$retval:s32")

        def engine(name: str, probes: list[ResolvedProbe], **options: object) -> None:
            stops[name] = []
            results[name] = measure.per_hit(
                lambda n: engine_run(program, probes, options, stops[name], n)
            )

        engine("probescope ptrace: entry", [entry])
        engine("probescope ptrace: entry+return", [entry, ret])
        engine("probescope ptrace: entry, single-step mode", [entry], single_step=True)
        engine("probescope ptrace: entry, unpinned", [entry], pin_cpu=False)
        taskset = ["taskset", "-c", str(cpu)]
        if shutil.which("gdb"):
            gdb = [
                "gdb",
                "-q",
                "-batch",
                "-nx",
                "-ex",
                "set breakpoint pending on",
                "-ex",
                'dprintf hit,"%d %s\\n",n,s',
                "-ex",
                "run",
                "--args",
                str(program),
            ]
            results["gdb dprintf"] = measure.per_hit(lambda n: timed([*gdb, str(n)]))
            results["gdb dprintf, pinned"] = measure.per_hit(
                lambda n: timed([*taskset, *gdb, str(n)])
            )
        if shutil.which("ltrace"):
            ltrace = ["ltrace", "-e", "hit", "-o", os.devnull, str(program)]
            results["ltrace -e hit"] = measure.per_hit(lambda n: timed([*ltrace, str(n)]))
            results["ltrace -e hit, pinned"] = measure.per_hit(
                lambda n: timed([*taskset, *ltrace, str(n)])
            )
        naive_cmd = [
            str(naive),
            str(program),
            hex(main_offset),
            str(library),
            hex(offset),
            "--",
            str(program),
        ]
        results["naive int3+single-step (C)"] = measure.per_hit(
            lambda n: timed([*naive_cmd, str(n)])
        )
        results["naive int3+single-step (C), pinned"] = measure.per_hit(
            lambda n: timed([*taskset, *naive_cmd, str(n)])
        )
        kernel = tracefs_run(library, offset, program)
        if kernel is not None:
            results["kernel uprobe (tracefs)"] = measure.per_hit(kernel)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    reference = results["probescope ptrace: entry"]
    print(
        f"cost per hit, {args.hits} hits, median of {args.runs} runs; probed instruction: "
        f"`{probed}`; {os.cpu_count()} CPUs\n"
    )
    print(f"{'tracer':42} {'µs/hit':>9} {'÷ probescope entry':>19} {'stops/hit':>10}")
    for name, cost in results.items():
        per_stop = statistics.median(stops[name]) if stops.get(name) else None
        stop_text = f"{per_stop:10.2f}" if per_stop is not None else f"{'':10}"
        print(f"{name:42} {cost * 1e6:9.2f} {cost / reference:18.2f}x {stop_text}")
    if "gdb dprintf" in results:
        print(
            f"\nprobescope entry is {results['gdb dprintf'] / reference:.1f}x cheaper per hit "
            f"than gdb dprintf (target: ≥ 5x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
