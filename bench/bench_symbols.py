"""Benchmark: listing and resolving every function of libc and python3, probescope vs its peers.

Run: `.venv/bin/python bench/bench_symbols.py [--runs N]`. In one run it measures

- probescope cold: a fresh interpreter (a subprocess) with an empty symbol cache imports
  probescope.symbols, builds the table (ELF parse, debug-file search, offsets, cache write),
  and looks every function up by name — wall time of the whole subprocess;
- probescope warm: the same with the cache filled, as wall time and in-process (from before
  `import probescope.symbols` to the last lookup, so interpreter start-up is excluded);
- peers on the same files: `perf probe -x FILE -F` (default filter, and `--filter '*'`),
  `nm -D --defined-only`, the bare interpreter (`python -c pass`), and pyelftools listing
  the same symbol tables in-process;

and prints medians with the ratio probescope/peer. Files stay in the page cache; only
probescope's own cache is cold. Subprocesses run with bytecode caching on (as an installed
package runs), after one warm-up run that writes the .pyc files.
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
from pathlib import Path

TARGETS = {
    "libc": "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "python3": "/usr/bin/python3.11",
}

RESOLVE_ALL = r"""
import sys, time
started = time.perf_counter()
import probescope.symbols as symbols
from probescope.errors import SymbolError
table = symbols.SymbolTable.for_path(sys.argv[1])
resolved = ambiguous = 0
for function in table.functions:
    try:
        table.lookup(function.display_name)
        resolved += 1
    except SymbolError:
        ambiguous += 1
elapsed = time.perf_counter() - started
print(f"{elapsed:.9f} {len(table.functions)} {resolved} {ambiguous} {int(table.from_cache)}")
"""

PYELFTOOLS_LIST = r"""
import sys, time
started = time.perf_counter()
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
count = 0
paths = sys.argv[1:]
for path in paths:
    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        for section in elf.iter_sections():
            if isinstance(section, SymbolTableSection):
                for symbol in section.iter_symbols():
                    if symbol["st_info"]["type"] in ("STT_FUNC", "STT_LOOS") and symbol["st_value"]:
                        count += 1
print(f"{time.perf_counter() - started:.9f} {count}")
"""


def _environment(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ, PROBESCOPE_CACHE_DIR=cache_dir)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _wall(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    return elapsed, result.stdout


def _count_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _debug_files(path: str) -> list[str]:
    """The files probescope reads for `path` (the binary and its debug file), for pyelftools."""
    from probescope.symbols.table import SymbolTable

    table = SymbolTable.for_path(path, use_cache=False)
    return [path] + ([table.debug_file] if table.debug_file else [])


class Row:
    def __init__(self, name: str) -> None:
        self.name = name
        self.times: dict[str, list[float]] = {}
        self.counts: dict[str, str] = {}

    def add(self, target: str, seconds: float, count: str) -> None:
        self.times.setdefault(target, []).append(seconds)
        self.counts[target] = count

    def median_ms(self, target: str) -> float:
        return statistics.median(self.times[target]) * 1000

    def min_ms(self, target: str) -> float:
        return min(self.times[target]) * 1000


def measure(runs: int) -> list[Row]:
    python = sys.executable
    rows = {
        name: Row(name)
        for name in (
            "probescope cold (subprocess wall)",
            "probescope cold (in-process)",
            "probescope warm (subprocess wall)",
            "probescope warm (in-process)",
            "python -c pass (interpreter only)",
            "perf probe -F",
            "perf probe -F --filter '*'",
            "nm -D --defined-only",
            "pyelftools list (in-process)",
        )
    }
    with tempfile.TemporaryDirectory(prefix="probescope-bench-") as scratch:
        warm_cache = os.path.join(scratch, "warm")
        for label, path in TARGETS.items():
            _wall([python, "-c", RESOLVE_ALL, path], _environment(warm_cache))  # writes .pyc too
            files = _debug_files(path)
            for run in range(runs):
                cold_cache = os.path.join(scratch, f"cold-{label}-{run}")
                seconds, out = _wall([python, "-c", RESOLVE_ALL, path], _environment(cold_cache))
                inner, functions, resolved, ambiguous, from_cache = out.split()
                assert from_cache == "0", "the cold run must not find a cache"
                assert int(resolved) + int(ambiguous) == int(functions)
                shutil.rmtree(cold_cache, ignore_errors=True)
                count = f"{functions} ({ambiguous} ambiguous)"
                rows["probescope cold (subprocess wall)"].add(label, seconds, count)
                rows["probescope cold (in-process)"].add(label, float(inner), count)
                seconds, out = _wall([python, "-c", RESOLVE_ALL, path], _environment(warm_cache))
                inner, _, _, _, from_cache = out.split()
                assert from_cache == "1", "the warm run must hit the cache"
                rows["probescope warm (subprocess wall)"].add(label, seconds, count)
                rows["probescope warm (in-process)"].add(label, float(inner), count)
                seconds, _ = _wall([python, "-c", "pass"], _environment(warm_cache))
                rows["python -c pass (interpreter only)"].add(label, seconds, "")
                seconds, out = _wall(["perf", "probe", "-x", path, "-F"])
                rows["perf probe -F"].add(label, seconds, str(_count_lines(out)))
                seconds, out = _wall(["perf", "probe", "-x", path, "-F", "--filter", "*"])
                rows["perf probe -F --filter '*'"].add(label, seconds, str(_count_lines(out)))
                seconds, out = _wall(["nm", "-D", "--defined-only", path])
                rows["nm -D --defined-only"].add(label, seconds, str(_count_lines(out)))
                _, out = _wall([python, "-c", PYELFTOOLS_LIST, *files], _environment(warm_cache))
                inner, count = out.split()
                rows["pyelftools list (in-process)"].add(label, float(inner), count)
    return list(rows.values())


def report(rows: list[Row], runs: int) -> str:
    by_name = {row.name: row for row in rows}
    lines = [
        f"probescope symbols benchmark — median (min) of {runs} runs, milliseconds "
        f"(host: {os.uname().release}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f})",
        "",
    ]
    header = f"{'measurement':38}" + "".join(
        f"{label + ' ms':>20}{label + ' functions':>24}" for label in TARGETS
    )
    lines += [header, "-" * len(header)]
    for row in rows:
        cells = "".join(
            f"{row.median_ms(label):12.1f} ({row.min_ms(label):5.1f})"
            f"{row.counts.get(label, ''):>24}"
            for label in TARGETS
        )
        lines.append(f"{row.name:38}{cells}")
    lines += ["", "ratios probescope / peer (below 1.0: probescope is faster)"]
    comparisons = [
        ("probescope cold (subprocess wall)", "perf probe -F"),
        ("probescope cold (subprocess wall)", "perf probe -F --filter '*'"),
        ("probescope cold (subprocess wall)", "nm -D --defined-only"),
        ("probescope warm (subprocess wall)", "perf probe -F"),
        ("probescope warm (subprocess wall)", "nm -D --defined-only"),
        ("probescope cold (in-process)", "pyelftools list (in-process)"),
        ("probescope warm (in-process)", "pyelftools list (in-process)"),
    ]
    for ours, peer in comparisons:
        ratios = "".join(
            f"  {label}: {by_name[ours].median_ms(label) / by_name[peer].median_ms(label):5.2f}"
            for label in TARGETS
        )
        lines.append(f"  {ours:36} vs {peer:28}{ratios}")
    warm_libc = by_name["probescope warm (in-process)"].median_ms("libc")
    cold_libc = by_name["probescope cold (subprocess wall)"].median_ms("libc")
    perf_libc = by_name["perf probe -F"].median_ms("libc")
    lines += [
        "",
        f"target warm ≤ 50 ms for libc (in-process): {warm_libc:.1f} ms "
        f"{'MET' if warm_libc <= 50 else 'MISSED'}",
        f"target cold ≤ perf probe -F for libc: {cold_libc:.1f} ms vs {perf_libc:.1f} ms "
        f"{'MET' if cold_libc <= perf_libc else 'MISSED'}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (default 7)")
    args = parser.parse_args()
    missing = [p for p in TARGETS.values() if not Path(p).exists()]
    if missing or shutil.which("perf") is None or shutil.which("nm") is None:
        print(f"missing: {missing or 'perf or nm'} (make bench-deps installs the peers)")
        return 1
    print(report(measure(args.runs), args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
