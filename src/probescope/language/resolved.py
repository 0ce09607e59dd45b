"""ResolvedProbe: a kernel-grammar spec bound to a concrete place — what every engine receives."""

from __future__ import annotations

from dataclasses import dataclass

from probescope.language.model import ProbeKind, ProbeSpec, UprobeLocation
from probescope.language.static_events import FunctionSpec, TracepointSpec


@dataclass(frozen=True)
class ResolvedProbe:
    """A probe ready to attach.

    For uprobes `spec.location` carries the path, file offset and ref_ctr offset the kernel gets;
    the other fields say where that offset came from, so engines and sinks can name it.
    `path` is the file as probescope opens it (through `/proc/PID/root` for a process in a
    container); `function_offset` is the file offset of the enclosing function's first byte.

    Facts symbols/ found about the file, so that engines need not read it again:
    `boundary_checked` says `offset` was checked to be an instruction boundary in code
    (symbols.insn.check_probe_offset); `go_binary` whether Go linked the file (its runtime
    moves goroutine stacks under hijacked return addresses), None when nobody looked.
    """

    spec: ProbeSpec | TracepointSpec | FunctionSpec
    kind: ProbeKind
    path: str | None = None
    offset: int | None = None
    ref_ctr_offset: int | None = None
    symbol: str | None = None
    symbol_offset: int = 0
    function_offset: int | None = None
    function_size: int | None = None
    vaddr: int | None = None
    device: int | None = None
    inode: int | None = None
    build_id: str | None = None
    boundary_checked: bool = False
    go_binary: bool | None = None

    @property
    def on_function_entry(self) -> bool:
        return self.symbol is not None and self.symbol_offset == 0

    @property
    def label(self) -> str:
        """`symbol+off` when known, else `path:0xoffset` — for summaries and messages."""
        if self.symbol:
            return f"{self.symbol}+{self.symbol_offset}" if self.symbol_offset else self.symbol
        if isinstance(self.spec, ProbeSpec):
            return str(self.spec.location)
        return str(self.spec)

    @classmethod
    def from_uprobe_spec(cls, spec: ProbeSpec) -> ResolvedProbe:
        """A kernel-grammar uprobe taken as given: path and offset are the user's own."""
        loc = spec.location
        assert isinstance(loc, UprobeLocation)
        return cls(
            spec=spec,
            kind=spec.kind,
            path=loc.path,
            offset=loc.offset,
            ref_ctr_offset=loc.ref_ctr_offset,
        )
