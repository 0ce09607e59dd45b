"""Helpers for the ptrace engine's tests: probes resolved by symbol, a runner that traces a
command (capturing its output), the untraced reference run, and text-vs-file comparison."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from probescope.engines.base import EngineStats, Target
from probescope.engines.launch import GatedCommand
from probescope.engines.ptrace import PtraceEngine
from probescope.events import Event, EventBatch
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeSpec
from probescope.language.resolved import ResolvedProbe

TARGETS = Path(__file__).resolve().parents[2] / "targets" / "ptrace"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def ptrace_skip_reason() -> str | None:
    ready = PtraceEngine().available()
    return None if ready.ok else ready.reason


@dataclass(frozen=True)
class Symbol:
    offset: int  # file offset
    size: int
    vaddr: int


def elf_symbol(path: str | Path, name: str) -> Symbol:
    """A symbol's file offset (PT_LOAD arithmetic), from .symtab then .dynsym."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for table in (".symtab", ".dynsym"):
            section = elf.get_section_by_name(table)
            if section is None:
                continue
            for symbol in section.iter_symbols():
                if symbol.name != name or symbol["st_shndx"] == "SHN_UNDEF":
                    continue
                value = symbol["st_value"]
                for segment in elf.iter_segments():
                    if segment["p_type"] != "PT_LOAD":
                        continue
                    start = segment["p_vaddr"]
                    if start <= value < start + segment["p_filesz"]:
                        return Symbol(value - start + segment["p_offset"], symbol["st_size"], value)
    raise LookupError(f"{name} not in {path}")


def make_probe(
    path: str | Path,
    symbol: str,
    args: str = "",
    *,
    kind: str = "p",
    event: str | None = None,
    group: str = "ptrace_test",
    function: str | None = None,
) -> ResolvedProbe:
    """A ResolvedProbe for `symbol` in `path`, parsed from kernel grammar text.

    `function` names the enclosing function when `symbol` is a label inside it."""
    site = elf_symbol(path, symbol)
    func = elf_symbol(path, function) if function else site
    name = event or symbol
    text = f"{kind}:{group}/{name} {path}:0x{site.offset:x} {args}".strip()
    spec = parse_kernel_probe(text)
    assert isinstance(spec, ProbeSpec)
    probe = ResolvedProbe.from_uprobe_spec(spec)
    return replace(
        probe,
        symbol=function or symbol,
        symbol_offset=site.offset - func.offset,
        function_offset=func.offset,
        function_size=func.size or None,
    )


@dataclass
class Run:
    events: list[Event]
    stats: EngineStats
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    engine: PtraceEngine

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]


@dataclass
class Plain:
    exit_code: int
    stdout: bytes
    stderr: bytes


def run_plain(argv: Sequence[str], **kwargs: Any) -> Plain:
    done = subprocess.run(list(argv), capture_output=True, timeout=60, **kwargs)
    return Plain(done.returncode, done.stdout, done.stderr)


def run_traced(
    probes: Sequence[ResolvedProbe],
    argv: Sequence[str],
    *,
    handlers: Iterable[tuple[ResolvedProbe, Callable[[Any], None]]] = (),
    follow_children: bool = True,
    engine: PtraceEngine | None = None,
    on_event: Callable[[Event, PtraceEngine], None] | None = None,
) -> Run:
    """Trace `argv` from its first instruction; its stdout/stderr go to files we read back."""
    engine = engine or PtraceEngine()
    for probe, handler in handlers:
        engine.on(probe, handler)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            engine.attach(
                probes, Target(command=tuple(str(a) for a in argv), follow_children=follow_children)
            )
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        events: list[Event] = []
        for item in engine.events():
            batch = item.events if isinstance(item, EventBatch) else [item]
            for event in batch:
                events.append(event)
                if on_event is not None:
                    on_event(event, engine)
        out.seek(0)
        err.seek(0)
        return Run(events, engine.stats(), engine.exit_code, out.read(), err.read(), engine)


def gated(argv: Sequence[str | Path], output: Path) -> GatedCommand:
    """A program forked and held before its exec, its stdout going to `output`: attach to
    its pid, then `release()` it — a process the tracer did not start, traced from its first
    instruction."""
    with open(output, "w") as out:
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            command = GatedCommand([str(a) for a in argv])
            command.start()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    return command


def assert_same_behaviour(run: Run, plain: Plain) -> None:
    """The traced program printed and exited exactly as it does untraced."""
    assert run.stdout == plain.stdout
    assert run.stderr == plain.stderr
    assert run.exit_code == plain.exit_code
