"""Which engines exist, how to build one by name, and how `auto` chooses."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from probescope.engines.base import Availability, Engine, EngineOptions
from probescope.errors import EngineUnavailable
from probescope.language.model import ProbeKind
from probescope.language.resolved import ResolvedProbe
from probescope.system.kernel import RunningKernel


@dataclass(frozen=True)
class EngineEntry:
    name: str
    module: str
    factory: str
    kinds: frozenset[ProbeKind]
    summary: str

    def load(self) -> Callable[..., Engine]:
        """The engine's factory: `factory(options=EngineOptions(), kernel=RunningKernel)`."""
        module = importlib.import_module(self.module)
        return getattr(module, self.factory)  # type: ignore[no-any-return]


ENGINES: tuple[EngineEntry, ...] = (
    EngineEntry(
        "tracefs",
        "probescope.engines.tracefs.engine",
        "TracefsEngine",
        frozenset(
            {
                ProbeKind.UPROBE,
                ProbeKind.URETPROBE,
                ProbeKind.KPROBE,
                ProbeKind.KRETPROBE,
                ProbeKind.TRACEPOINT,
                ProbeKind.FUNCTION,
                ProbeKind.USDT,
            }
        ),
        "the kernel's uprobes and trace events through tracefs (root)",
    ),
    EngineEntry(
        "ptrace",
        "probescope.engines.ptrace.engine",
        "PtraceEngine",
        frozenset({ProbeKind.UPROBE, ProbeKind.URETPROBE}),
        "uprobes re-implemented in user space with ptrace (no root needed)",
    ),
)
BY_NAME = {entry.name: entry for entry in ENGINES}
ENGINE_CHOICES = ("auto", *BY_NAME)


def availability(entry: EngineEntry, kernel: RunningKernel | None = None) -> Availability:
    try:
        engine = entry.load()(kernel=kernel or RunningKernel.read())
    except ImportError as error:
        return Availability(False, f"not installed: {error}")
    return engine.available()


def create_engine(
    name: str,
    probes: Sequence[ResolvedProbe] = (),
    *,
    options: EngineOptions | None = None,
    kernel: RunningKernel | None = None,
) -> Engine:
    """The engine `name`, or for `auto` the first that can run here and handles every probe."""
    kinds = {probe.kind for probe in probes}
    kernel = kernel or RunningKernel.read()
    options = options or EngineOptions()
    if name != "auto":
        entry = BY_NAME[name]
        unsupported = kinds - entry.kinds
        if unsupported:
            raise EngineUnavailable(
                f"the {name} engine cannot run {', '.join(sorted(unsupported))} probes",
                hint="choose another --engine",
            )
        engine = entry.load()(options=options, kernel=kernel)
        state = engine.available()
        if not state.ok:
            raise EngineUnavailable(
                f"the {name} engine cannot run here: {state.reason}", hint=state.hint
            )
        return engine
    reasons = []
    for entry in ENGINES:
        if kinds - entry.kinds:
            reasons.append(
                f"{entry.name}: does not handle {', '.join(sorted(kinds - entry.kinds))}"
            )
            continue
        try:
            engine = entry.load()(options=options, kernel=kernel)
        except ImportError as error:
            reasons.append(f"{entry.name}: {error}")
            continue
        state = engine.available()
        if state.ok:
            return engine
        reasons.append(f"{entry.name}: {state.reason}")
    raise EngineUnavailable(
        "no engine can run these probes here: " + "; ".join(reasons),
        hint="`probescope engines` explains what each engine needs",
    )
