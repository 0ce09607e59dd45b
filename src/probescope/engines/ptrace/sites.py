"""Turn ResolvedProbes into ProbeSites, refusing bad ones before anything is touched.

Every probe is checked against its file alone (the tracee is not touched yet): the instruction
at the offset must be one the kernel accepts, the offset must be an instruction boundary of its
function when the function is known, return probes must sit on a function's first instruction
and not in a Go binary, and fetchargs must compile. All problems are collected and reported in
one PtraceError.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace.fetch import ProbeFetcher
from probescope.engines.ptrace.tracee import ProbeSite
from probescope.errors import PtraceError
from probescope.events import EventType
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe

_go_cache: dict[tuple[int, int], bool] = {}


def is_go_binary(path: str) -> bool:
    """A Go binary carries `.go.buildinfo` (or a Go build-id note)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    key = (st.st_dev, st.st_ino)
    if key not in _go_cache:
        found = False
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                found = any(
                    elf.get_section_by_name(name) is not None
                    for name in (".go.buildinfo", ".note.go.buildid")
                )
        except (OSError, ELFError):
            found = False
        _go_cache[key] = found
    return _go_cache[key]


def _file_key(probe: ResolvedProbe) -> tuple[int, int]:
    """(device, inode) of the probed file: as resolved, else as it is now."""
    if probe.device is not None and probe.inode is not None:
        return probe.device, probe.inode
    assert probe.path is not None
    st = os.stat(probe.path)
    return st.st_dev, st.st_ino


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
            key = _file_key(probe)
            code = _read_file(path, probe.offset, arch.MAX_INSTRUCTION + 1)
        except OSError as error:
            problems.append(f"{where}: cannot read {path}: {error.strerror}")
            continue
        if len(code) == 0:
            problems.append(f"{where}: offset 0x{probe.offset:x} is beyond the end of {path}")
            continue
        try:
            arch.analyze(code, probe.offset)
            if probe.function_offset is not None and probe.function_offset < probe.offset:
                length = probe.offset - probe.function_offset + arch.MAX_INSTRUCTION
                body = _read_file(path, probe.function_offset, length)
                arch.check_boundary(body, probe.function_offset, probe.offset)
        except PtraceError as error:
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
            if is_go_binary(path):
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
            event_type = EventType(
                group=names[0],
                name=names[1],
                kind=probe.kind,
                arg_names=tuple(a.name for a in spec.args),
                arg_types=tuple(a.type for a in spec.args),
            )
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
