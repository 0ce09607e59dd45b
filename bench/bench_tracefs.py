"""Benchmark of the tracefs engine, probescope vs its peers, in one run.

Run as root: `.venv/bin/python bench/bench_tracefs.py [--parts b] [--events N] [--runs R]`.
Each part is a function in PARTS; `main` runs every part asked for (default: all present) and
prints medians of R runs with events/s and the ratio probescope/peer.

(b) ring-buffer decode. A C target calls a uprobed function N times (an int and a string
    argument), pinned to one CPU, into a private instance whose buffer holds all N events. Then,
    on those same events: `cat trace` (the kernel's text, non-consuming), the raw read of
    `per_cpu/cpuN/trace_pipe_raw` (os.read of whole sub-buffers, consuming), probescope
    decoding the saved sub-buffers into Event objects and into kernel-identical text lines
    (checked byte for byte against `cat trace`), and `trace-cmd report` on a trace.dat built from
    the very same sub-buffers with `trace-cmd restore` (`trace-cmd record` cannot run here: it
    writes `ftrace_enabled`). The kernel's `trace_pipe` consumes, so for it the target runs again
    per measurement and `head -n N trace_pipe` is timed until all N events are read.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from probescope.engines.tracefs.decoder import EventDecoder
from probescope.engines.tracefs.format import (
    parse_event_format,
    parse_header_event,
    parse_header_page,
    parse_saved_cmdlines,
)
from probescope.engines.tracefs.ringbuffer import SubBufferLayout, split_sub_buffers
from probescope.sinks.text import TextSink

TRACEFS = Path("/sys/kernel/tracing")

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


@contextmanager
def probed_instance(binary: Path, offset: int, buffer_kb: int) -> Iterator[tuple[Path, str]]:
    """An instance with one enabled-on-demand uprobe; everything removed on exit."""
    pid = os.getpid()
    instance = TRACEFS / "instances" / f"probescope-bench-{pid}"
    group = f"probescope_bench_{pid}"
    defined = False
    os.mkdir(instance)
    try:
        _write(instance / "buffer_size_kb", str(buffer_kb))
        _append(
            TRACEFS / "uprobe_events",
            f"p:{group}/hit {binary}:0x{offset:x} n=%di:s32 s=+0(%si):string",
        )
        defined = True
        yield instance, group
    finally:
        try:
            _write(instance / "events" / group / "hit" / "enable", "0")
        except OSError:
            pass
        if defined:
            _append(TRACEFS / "uprobe_events", f"-:{group}/hit")
        for _ in range(50):
            try:
                os.rmdir(instance)
                break
            except OSError as error:
                if error.errno != errno.EBUSY:
                    raise
                time.sleep(0.1)


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


def build(directory: Path) -> tuple[Path, int]:
    source = directory / "loop.c"
    source.write_text(LOOP_SOURCE)
    binary = directory / "probescope-bench-loop"
    subprocess.run(["gcc", "-O0", "-o", str(binary), str(source)], check=True)
    from elftools.elf.elffile import ELFFile

    with binary.open("rb") as stream:
        elf = ELFFile(stream)
        symbol = elf.get_section_by_name(".symtab").get_symbol_by_name("probed")[0]
        value = symbol["st_value"]
        for segment in elf.iter_segments("PT_LOAD"):
            start = segment["p_vaddr"]
            if start <= value < start + segment["p_filesz"]:
                return binary, value - start + segment["p_offset"]
    raise RuntimeError("probed() is not in a PT_LOAD segment")


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
                    sink = TextSink(null)
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
    sink = TextSink(stream)
    for sub_buffer in sub_buffers:
        sink.write_batch(decoder.decode(sub_buffer, cpu))
    lines = trace.split(b"\n")
    header = 0
    while header < len(lines) and lines[header].startswith(b"#"):
        header += 1
    if stream.getvalue() != b"\n".join(lines[header:]):
        raise RuntimeError("probescope's text differs from the kernel's trace")


PARTS: dict[str, Callable[[Options], list[Result]]] = {"b": part_b_decode}


def print_results(results: list[Result]) -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=min(1, (os.cpu_count() or 1) - 1))
    parser.add_argument("--keep", type=Path, help="copy the captured data into this directory")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_tracefs.py needs root (it defines uprobes in tracefs)", file=sys.stderr)
        return 2
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"unknown parts {unknown}; present: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    options = Options(args.events, args.runs, args.cpu, args.keep)
    results: list[Result] = []
    for part in parts:
        results += PARTS[part](options)
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
