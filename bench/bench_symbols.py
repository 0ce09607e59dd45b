"""Benchmark: listing and resolving every function of libc and python3, probescope vs its peers.

Run: `.venv/bin/python bench/bench_symbols.py [--runs N]`. In one run it measures

- probescope cold: a fresh interpreter (a subprocess) with an empty symbol cache imports
  probescope.symbols, builds the table (ELF parse, debug-file search, offsets, cache write),
  and looks every function up by name — wall time of the whole subprocess, and in-process
  (from before the import to the last lookup) split into import, table and lookups;
- probescope warm: the same with the cache filled;
- the command a user types, `probescope symbols FILE` (every function with its offset, as
  `perf probe -F` prints them), cold and warm;
- peers on the same files: `perf probe -x FILE -F` (default filter, and `--filter '*'`),
  `nm -D --defined-only`, and pyelftools listing the same symbol tables in-process;
- floors: the bare interpreter (`python -c pass`, and `python -I -S -c pass` without site
  packages) and perf's own start-up (`perf --version`);
- start-up of the commands users type most: `probescope resolve 'c:malloc size=arg1'` and
  `probescope trace --dry-run 'c:malloc size=arg1'` (warm cache), and with `--baseline DIR` the
  same commands run from another checkout's `src/` (e.g. `git worktree add /tmp/old REV`) in the
  same run, so a change's effect on start-up is measured against the code before it;

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
import probescope.symbols.table
imported = time.perf_counter()
table = symbols.SymbolTable.for_path(sys.argv[1])
loaded = time.perf_counter()
resolved = ambiguous = 0
for function in table.functions:
    try:
        table.lookup(function.display_name)
        resolved += 1
    except SymbolError:
        ambiguous += 1
ended = time.perf_counter()
print(
    f"{ended - started:.9f} {imported - started:.9f} {loaded - imported:.9f} {ended - loaded:.9f}"
    f" {len(table.functions)} {resolved} {ambiguous} {int(table.from_cache)}"
)
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


ROWS = (
    "probescope cold (subprocess wall)",
    "probescope cold (in-process)",
    "  import of the symbol layer",
    "  table: ELF read, build, cache write",
    "  lookup of every function by name",
    "probescope warm (subprocess wall)",
    "probescope warm (in-process)",
    "  table: cache read",
    "probescope symbols FILE, cold (wall)",
    "probescope symbols FILE, warm (wall)",
    "perf probe -F",
    "perf probe -F --filter '*'",
    "nm -D --defined-only",
    "pyelftools list (in-process)",
    "python -c pass (interpreter only)",
    "python -I -S -c pass (bare interpreter)",
    "perf --version (perf start-up)",
)


def _resolve_all(python: str, path: str, cache: str) -> tuple[float, list[float], str, bool]:
    seconds, out = _wall([python, "-c", RESOLVE_ALL, path], _environment(cache))
    inner, imported, loaded, looked_up, functions, resolved, ambiguous, from_cache = out.split()
    assert int(resolved) + int(ambiguous) == int(functions)
    phases = [float(inner), float(imported), float(loaded), float(looked_up)]
    return seconds, phases, f"{functions} ({ambiguous} ambiguous)", from_cache == "1"


def measure(runs: int) -> list[Row]:
    python = sys.executable
    command = [python, "-m", "probescope", "symbols"]
    rows = {name: Row(name) for name in ROWS}
    with tempfile.TemporaryDirectory(prefix="probescope-bench-") as scratch:
        warm_cache = os.path.join(scratch, "warm")
        for label, path in TARGETS.items():
            _wall([python, "-c", RESOLVE_ALL, path], _environment(warm_cache))  # writes .pyc too
            _wall([*command, path], _environment(warm_cache))
            files = _debug_files(path)
            for run in range(runs):
                cold_cache = os.path.join(scratch, f"cold-{label}-{run}")
                seconds, phases, count, from_cache = _resolve_all(python, path, cold_cache)
                assert not from_cache, "the cold run must not find a cache"
                shutil.rmtree(cold_cache, ignore_errors=True)
                rows["probescope cold (subprocess wall)"].add(label, seconds, count)
                for name, value in zip(ROWS[1:5], phases, strict=True):
                    rows[name].add(label, value, count if name == ROWS[1] else "")
                seconds, phases, count, from_cache = _resolve_all(python, path, warm_cache)
                assert from_cache, "the warm run must hit the cache"
                rows["probescope warm (subprocess wall)"].add(label, seconds, count)
                rows["probescope warm (in-process)"].add(label, phases[0], count)
                rows["  table: cache read"].add(label, phases[2], "")
                seconds, out = _wall([*command, path], _environment(cold_cache))
                shutil.rmtree(cold_cache, ignore_errors=True)
                listed = str(_count_lines(out) - 2)  # a summary line and the header
                rows["probescope symbols FILE, cold (wall)"].add(label, seconds, listed)
                seconds, out = _wall([*command, path], _environment(warm_cache))
                rows["probescope symbols FILE, warm (wall)"].add(label, seconds, listed)
                seconds, out = _wall(["perf", "probe", "-x", path, "-F"])
                rows["perf probe -F"].add(label, seconds, str(_count_lines(out)))
                seconds, out = _wall(["perf", "probe", "-x", path, "-F", "--filter", "*"])
                rows["perf probe -F --filter '*'"].add(label, seconds, str(_count_lines(out)))
                seconds, out = _wall(["nm", "-D", "--defined-only", path])
                rows["nm -D --defined-only"].add(label, seconds, str(_count_lines(out)))
                _, out = _wall([python, "-c", PYELFTOOLS_LIST, *files], _environment(warm_cache))
                inner, listed = out.split()
                rows["pyelftools list (in-process)"].add(label, float(inner), listed)
                seconds, _ = _wall([python, "-c", "pass"], _environment(warm_cache))
                rows["python -c pass (interpreter only)"].add(label, seconds, "")
                seconds, _ = _wall([python, "-I", "-S", "-c", "pass"])
                rows["python -I -S -c pass (bare interpreter)"].add(label, seconds, "")
                seconds, _ = _wall(["perf", "--version"])
                rows["perf --version (perf start-up)"].add(label, seconds, "")
    return [rows[name] for name in ROWS]


STARTUP_SPEC = "c:malloc size=arg1"
STARTUP_COMMANDS = {
    "probescope resolve": ["resolve", STARTUP_SPEC],
    "probescope trace --dry-run": ["trace", "--dry-run", STARTUP_SPEC],
}


def measure_startup(runs: int, baseline: Path | None) -> dict[str, list[float]]:
    """Wall seconds of each start-up command (warm symbol cache), and with a baseline checkout
    the same commands run from its sources, interleaved so that load hits both alike."""
    python = sys.executable
    sources = {"": None} if baseline is None else {"": None, " (baseline)": baseline / "src"}
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="probescope-bench-") as scratch:
        # Each checkout its own symbol cache: their cache formats may differ.
        envs = {suffix: _environment(os.path.join(scratch, f"cache{suffix}")) for suffix in sources}
        for suffix, source in sources.items():
            if source is not None:
                envs[suffix]["PYTHONPATH"] = str(source)
            for words in STARTUP_COMMANDS.values():
                _wall([python, "-m", "probescope", *words], envs[suffix])  # cache and .pyc files
        for _ in range(runs):
            for suffix, env in envs.items():
                for name, words in STARTUP_COMMANDS.items():
                    seconds, _ = _wall([python, "-m", "probescope", *words], env)
                    times.setdefault(name + suffix, []).append(seconds)
    return times


def report_startup(times: dict[str, list[float]]) -> str:
    lines = ["", f"start-up, warm cache ({STARTUP_SPEC!r}) — median (min), milliseconds"]
    for name, values in times.items():
        lines.append(
            f"  {name:42}{statistics.median(values) * 1000:10.1f} ({min(values) * 1000:6.1f})"
        )
    for name in STARTUP_COMMANDS:
        if name + " (baseline)" in times:
            ratio = statistics.median(times[name]) / statistics.median(times[name + " (baseline)"])
            lines.append(f"  {name} / baseline: {ratio:.2f}")
    return "\n".join(lines)


def report(rows: list[Row], runs: int) -> str:
    by_name = {row.name: row for row in rows}
    lines = [
        f"probescope symbols benchmark — median (min) of {runs} runs, milliseconds "
        f"(host: {os.uname().release}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f})",
        "",
    ]
    header = f"{'measurement':40}" + "".join(
        f"{label + ' ms':>20}{label + ' functions':>24}" for label in TARGETS
    )
    lines += [header, "-" * len(header)]
    for row in rows:
        cells = "".join(
            f"{row.median_ms(label):12.1f} ({row.min_ms(label):5.1f})"
            f"{row.counts.get(label, ''):>24}"
            for label in TARGETS
        )
        lines.append(f"{row.name:40}{cells}")
    lines += ["", "ratios probescope / peer (below 1.0: probescope is faster)"]
    comparisons = [
        ("probescope cold (subprocess wall)", "perf probe -F"),
        ("probescope cold (subprocess wall)", "nm -D --defined-only"),
        ("probescope cold (in-process)", "perf probe -F"),
        ("probescope warm (subprocess wall)", "perf probe -F"),
        ("probescope warm (subprocess wall)", "nm -D --defined-only"),
        ("probescope symbols FILE, cold (wall)", "perf probe -F --filter '*'"),
        ("probescope symbols FILE, warm (wall)", "perf probe -F --filter '*'"),
        ("probescope cold (in-process)", "pyelftools list (in-process)"),
        ("probescope warm (in-process)", "pyelftools list (in-process)"),
        ("python -I -S -c pass (bare interpreter)", "perf probe -F"),
    ]
    for ours, peer in comparisons:
        ratios = "".join(
            f"  {label}: {by_name[ours].median_ms(label) / by_name[peer].median_ms(label):5.2f}"
            for label in TARGETS
        )
        lines.append(f"  {ours:39} vs {peer:28}{ratios}")

    def libc(name: str) -> float:
        return by_name[name].median_ms("libc")

    warm, cold, perf = (
        libc("probescope warm (in-process)"),
        libc("probescope cold (subprocess wall)"),
        libc("perf probe -F"),
    )
    bare, lookups = libc("python -I -S -c pass (bare interpreter)"), libc(ROWS[4])
    lines += [
        "",
        f"target warm ≤ 50 ms for libc (in-process, imports included): {warm:.1f} ms "
        f"{'MET' if warm <= 50 else 'MISSED'}",
        f"target cold ≤ perf probe -F for libc: {cold:.1f} ms vs {perf:.1f} ms "
        f"{'MET' if cold <= perf else 'MISSED'}",
        f"  out of reach of a Python process: the bare interpreter ({bare:.1f} ms) plus the "
        f"lookup of every name ({lookups:.1f} ms) already take {(bare + lookups) / perf:.2f}× "
        "perf probe -F before a symbol table is read",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (default 7)")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another checkout whose start-up to measure beside this one",
    )
    parser.add_argument(
        "--startup-only", action="store_true", help="measure only the commands' start-up"
    )
    args = parser.parse_args()
    if args.startup_only:
        print(report_startup(measure_startup(args.runs, args.baseline)))
        return 0
    missing = [p for p in TARGETS.values() if not Path(p).exists()]
    if missing or shutil.which("perf") is None or shutil.which("nm") is None:
        print(f"missing: {missing or 'perf or nm'} (make bench-deps installs the peers)")
        return 1
    print(report(measure(args.runs), args.runs))
    print(report_startup(measure_startup(args.runs, args.baseline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
