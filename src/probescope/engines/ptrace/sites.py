"""Turn ResolvedProbes into ProbeSites, refusing bad ones before anything is touched.

Every probe is checked against its file alone (the tracee is not touched yet): the instruction
at the offset must be one the kernel accepts, the offset must be an instruction boundary in code
(symbols/insn.py's check, which resolving a probe has usually run already), return probes must
sit on a function's first instruction and not in a Go binary, and fetchargs must compile. All
problems are collected and reported in one PtraceError.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace.fetch import ProbeFetcher
from probescope.engines.ptrace.insn_x86_64 import analyze
from probescope.engines.ptrace.tracee import ProbeSite
from probescope.errors import PtraceError, SymbolError
from probescope.events import EventType
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.symbols.insn import check_probe_site
from probescope.symbols.table import SymbolTable


def _file_key(probe: ResolvedProbe, path: str) -> tuple[int, int]:
    """(device, inode) of the probed file: as resolved, else as it is now."""
    if probe.device is not None and probe.inode is not None:
        return probe.device, probe.inode
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _is_go(probe: ResolvedProbe, path: str) -> bool:
    """Whether the probed file was linked by Go: as resolved, else as symbols/ reads it now."""
    if probe.go_binary is not None:
        return probe.go_binary
    try:
        return SymbolTable.for_path(path).is_go
    except SymbolError:
        return False


def _read_file(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def build_sites(
    probes: Sequence[ResolvedProbe], handlers: dict[ResolvedProbe, list[Callable[[Any], None]]]
) -> list[ProbeSite]:
    problems: list[str] = []
    sites: list[ProbeSite] = []
    event_types: dict[tuple[str, str], EventType] = {}
    for probe in probes:
        where = probe.label
        if probe.kind not in (ProbeKind.UPROBE, ProbeKind.URETPROBE):
            problems.append(
                f"{where}: the ptrace engine handles uprobes and uretprobes, not {probe.kind}"
            )
            continue
        if probe.path is None or probe.offset is None:
            problems.append(f"{where}: no file and offset resolved")
            continue
        path = probe.path
        try:
            key = _file_key(probe, path)
            code = _read_file(path, probe.offset, arch.MAX_INSTRUCTION + 1)
        except OSError as error:
            problems.append(f"{where}: cannot read {path}: {error.strerror}")
            continue
        if len(code) == 0:
            problems.append(f"{where}: offset 0x{probe.offset:x} is beyond the end of {path}")
            continue
        try:
            analyze(code, probe.offset)
            if not probe.boundary_checked:
                check_probe_site(path, probe.offset, probe.function_offset)
        except (PtraceError, SymbolError) as error:
            problems.append(f"{where}: {error.message}")
            continue
        is_return = probe.kind is ProbeKind.URETPROBE
        if is_return:
            if probe.function_offset is not None and probe.function_offset != probe.offset:
                problems.append(
                    f"{where}: a return probe must be on the function's first "
                    "instruction (its return address is at [sp] only there)"
                )
                continue
            if _is_go(probe, path):
                problems.append(
                    f"{where}: return probes on Go binaries are refused: Go moves "
                    "goroutine stacks and would crash on the hijacked return"
                )
                continue
        spec = probe.spec
        if not isinstance(spec, ProbeSpec):
            problems.append(f"{where}: not a uprobe definition")
            continue
        try:
            fetcher = ProbeFetcher(spec.args, is_return)
        except PtraceError as error:
            problems.append(f"{where}: {error.message}")
            continue
        names = (spec.group_name, spec.event_name)
        event_type = event_types.get(names)
        if event_type is None:
            event_type = EventType.of_probe(spec, probe.kind)
            event_types[names] = event_type
        sites.append(
            ProbeSite(
                probe=probe,
                event_type=event_type,
                fetcher=fetcher,
                key=f"{names[0]}/{names[1]}",
                file_key=key,
                offset=probe.offset,
                is_return=is_return,
                handlers=list(handlers.get(probe, [])),
            )
        )
    semaphores: dict[tuple[tuple[int, int], int], int | None] = {}
    for site in sites:
        place = (site.file_key, site.offset)
        ref = site.probe.ref_ctr_offset
        if place in semaphores and semaphores[place] != ref:
            problems.append(
                f"{site.probe.label}: probes on one site must agree on its semaphore "
                f"(0x{semaphores[place] or 0:x} vs 0x{ref or 0:x}; the kernel refuses it too)"
            )
        semaphores.setdefault(place, ref)
    if problems:
        count = len(problems)
        raise PtraceError(
            (
                f"{count} probes cannot be attached:\n  "
                if count > 1
                else "probe cannot be attached: "
            )
            + "\n  ".join(problems),
            hint="nothing was attached",
        )
    return sites
