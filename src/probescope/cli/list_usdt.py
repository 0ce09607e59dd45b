"""`probescope list usdt TARGET [GLOB] [-p PID]`: the USDT probes of a binary, ready to trace.

For each provider:name it prints its sites (file offsets of the `nop`s), its semaphore's file
offset, and each argument as the kernel fetcharg probescope will use — or why it cannot.
With a pid, it also prints the sites' addresses in that process and the semaphore's current
value there (non-zero while some tracer has the probe enabled).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Sequence
from typing import TextIO

from probescope.symbols.elfimage import ElfImage
from probescope.symbols.locate import locate_binary
from probescope.symbols.maps import mappings_of
from probescope.symbols.usdt import UsdtProbe, UsdtSite, usdt_probes
from probescope.system.maps import Mapping


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="TARGET", help="a path, a command on PATH or a library (c, libssl.so.3)"
    )
    parser.add_argument(
        "glob",
        metavar="GLOB",
        nargs="?",
        help="only probes matching PROVIDER:NAME globs (without ':' the provider or the name)",
    )
    parser.add_argument(
        "-p",
        "--pid",
        type=int,
        help="resolve TARGET as process PID sees it; show addresses and semaphores in it",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show each site's SDT argument string"
    )


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    path = str(locate_binary(args.target, args.pid))
    probes = usdt_probes(path)
    shown = select(probes, args.glob) if args.glob else probes
    mappings = mappings_of(args.pid, path) if args.pid is not None else None
    err.write(describe(path, probes, shown) + "\n")
    process = _Process(args.pid, mappings) if args.pid is not None and mappings else None
    for line in format_listing(shown, verbose=args.verbose, process=process):
        out.write(line + "\n")
    if args.pid is not None and not mappings:
        err.write(f"note: {path} is not mapped in process {args.pid}\n")
    if not probes:
        err.write(f"note: {path} has no .note.stapsdt section: it was not built with <sys/sdt.h>\n")
    elif args.glob and not shown:
        names = ", ".join(p.full_name for p in probes[:20])
        err.write(f"no USDT probe matches {args.glob!r}; the file has: {names}\n")
    return 0 if shown or not args.glob else 1


def select(probes: Sequence[UsdtProbe], glob: str) -> list[UsdtProbe]:
    """`PROVIDER:NAME` globs match both parts; a glob without `:` matches either one."""
    if ":" in glob:
        provider, _, name = glob.partition(":")
        return [
            p
            for p in probes
            if fnmatch.fnmatchcase(p.provider, provider) and fnmatch.fnmatchcase(p.name, name)
        ]
    return [
        p
        for p in probes
        if fnmatch.fnmatchcase(p.provider, glob) or fnmatch.fnmatchcase(p.name, glob)
    ]


def describe(path: str, probes: Sequence[UsdtProbe], shown: Sequence[UsdtProbe]) -> str:
    """The summary line: what the file is and how many probes and sites it has."""
    with ElfImage.from_path(path) as image:
        kind = f"{image.type_name} {image.machine_name}"
    sites = sum(len(p.sites) for p in shown)
    count = f"{len(shown)} of {len(probes)}" if len(shown) != len(probes) else str(len(shown))
    probe_word = _plural(len(probes), "probe")
    return f"{path}: {kind}; {count} USDT {probe_word} at {sites} {_plural(sites, 'site')}"


def _plural(count: int, noun: str) -> str:
    return noun if count == 1 else f"{noun}s"


class _Process:
    """A process the listing reads addresses and semaphore values from."""

    def __init__(self, pid: int, mappings: list[Mapping]) -> None:
        self.pid = pid
        self.mappings = mappings

    def address(self, offset: int, *, writable: bool = False) -> int | None:
        for mapping in sorted(self.mappings, key=lambda m: ("x" not in m.perms) ^ writable):
            if mapping.contains_file_offset(offset) and ("w" in mapping.perms) == writable:
                return mapping.address_of(offset)
        return None

    def semaphore(self, offset: int) -> int | None:
        address = self.address(offset, writable=True)
        if address is None:
            return None
        try:
            with open(f"/proc/{self.pid}/mem", "rb", buffering=0) as memory:
                memory.seek(address)
                value = memory.read(2)
        except OSError:
            return None
        return int.from_bytes(value, sys.byteorder) if len(value) == 2 else None


def format_listing(
    probes: Sequence[UsdtProbe], *, verbose: bool = False, process: _Process | None = None
) -> list[str]:
    """Per probe a header line, then one line per site with its fetchargs, then any problems."""
    lines = []
    for probe in probes:
        count = f"{len(probe.sites)} {_plural(len(probe.sites), 'site')}"
        semaphore = probe.semaphore_offset
        if semaphore is None:
            where = "no semaphore"
        else:
            where = f"semaphore {semaphore:#x}"
            value = process.semaphore(semaphore) if process is not None else None
            if process is not None:
                shown = "?" if value is None else str(value)
                where += f" (= {shown} in process {process.pid})"
        lines.append(f"{probe.full_name}  {count}  {where}")
        for site in probe.sites:
            lines += _site_lines(site, verbose, process)
    return lines


def _site_lines(site: UsdtSite, verbose: bool, process: _Process | None) -> list[str]:
    head = f"  {site.pc_offset:#x}"
    if process is not None:
        address = process.address(site.pc_offset)
        head += f" ({address:#x})" if address is not None else " (not mapped)"
    fetches = [a.definition or f"{a.name}=?" for a in site.args]
    lines = [" ".join([head, *fetches]) if fetches else f"{head}  (no arguments)"]
    if verbose:
        lines.append(f"      sdt: {site.arguments}" if site.arguments else "      sdt: (none)")
    for arg in site.args:
        if arg.problem is not None:
            lines.append(f"      {arg.problem}")
        elif arg.note is not None:
            lines.append(f"      {arg.name}: {arg.note}")
    return lines
