"""Which engines exist, how to build one by name, and how `auto` chooses."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from probescope.engines.base import Availability, Engine, EngineOptions
from probescope.errors import EngineUnavailable
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.system.kernel import RunningKernel


@dataclass(frozen=True)
class EngineEntry:
    name: str
    module: str
    factory: str
    kinds: frozenset[ProbeKind]
    summary: str
    filters_uprobes: bool = False  # applies a uprobe's `if` filter (ProbeSpec.filter)

    def load(self) -> Callable[..., Engine]:
        """The engine's factory: `factory(options=EngineOptions(), kernel=RunningKernel)`."""
        module = importlib.import_module(self.module)
        return getattr(module, self.factory)  # type: ignore[no-any-return]


ENGINES: tuple[EngineEntry, ...] = (
    EngineEntry(
        "bpf",
        "probescope.engines.bpf.engine",
        "BpfEngine",
        frozenset({ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.USDT, ProbeKind.TRACEPOINT}),
        "probes compiled to BPF in Python: in-kernel filters, fast attach, nothing left behind",
        filters_uprobes=True,
    ),
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
    EngineEntry(
        "fentry",
        "probescope.engines.fentry.fallback",
        "FallbackEngine",
        frozenset({ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.FUNCTION}),
        "function entries and returns patched into jumps, no trap per hit (processes only)",
    ),
)
BY_NAME = {entry.name: entry for entry in ENGINES}
ENGINE_CHOICES = ("auto", *BY_NAME)


def _user_function_tracer(probes: Sequence[ResolvedProbe]) -> bool:
    from probescope.engines.fentry.catalog import user_function_pattern

    return any(user_function_pattern(probe.spec) is not None for probe in probes)


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
    notes: list[str] | None = None,
) -> Engine:
    """The engine `name`, or for `auto` the first (in ENGINES order) that can run here and
    handles every probe; why each engine before it was passed over is appended to `notes`.
    An engine may refuse particular probes with an `unsupported(probes) -> str | None`."""
    kinds = {probe.kind for probe in probes}
    if name == "auto" and ProbeKind.FUNCTION in kinds and _user_function_tracer(probes):
        name = "fentry"  # `f:./prog:GLOB`: the user-space function tracer is fentry's
    kernel = kernel or RunningKernel.read()
    options = options or EngineOptions()
    filtered = _filtered_uprobe(probes)
    if name != "auto":
        entry = BY_NAME[name]
        unsupported = kinds - entry.kinds
        if unsupported:
            raise EngineUnavailable(
                f"the {name} engine cannot run {', '.join(sorted(unsupported))} probes",
                hint="choose another --engine",
            )
        if filtered and not entry.filters_uprobes:
            raise EngineUnavailable(
                f"the {name} engine does not filter uprobes ({filtered})",
                hint="--engine bpf evaluates a uprobe's `if` in the kernel",
            )
        engine = entry.load()(options=options, kernel=kernel)
        state = engine.available()
        if not state.ok:
            raise EngineUnavailable(
                f"the {name} engine cannot run here: {state.reason}", hint=state.hint
            )
        refusal = _unsupported(engine, probes)
        if refusal:
            raise EngineUnavailable(
                f"the {name} engine cannot run {refusal}", hint="choose another --engine"
            )
        return engine
    reasons = []
    for entry in ENGINES:
        if kinds - entry.kinds:
            reasons.append(
                f"{entry.name}: does not handle {', '.join(sorted(kinds - entry.kinds))}"
            )
            continue
        if filtered and not entry.filters_uprobes:
            reasons.append(f"{entry.name}: does not filter uprobes ({filtered})")
            continue
        try:
            engine = entry.load()(options=options, kernel=kernel)
        except ImportError as error:
            reasons.append(f"{entry.name}: {error}")
            continue
        state = engine.available()
        refusal = _unsupported(engine, probes, auto=True) if state.ok else None
        if state.ok and refusal is None:
            if notes is not None and reasons:
                notes.append("engine auto: passed over " + "; ".join(reasons))
            return engine
        reasons.append(f"{entry.name}: {refusal or state.reason}")
    raise EngineUnavailable(
        "no engine can run these probes here: " + "; ".join(reasons),
        hint="`probescope engines` explains what each engine needs",
    )


def _filtered_uprobe(probes: Sequence[ResolvedProbe]) -> str | None:
    """The first user-space probe with an `if` filter, named for a message (None: none)."""
    for probe in probes:
        spec = probe.spec
        if isinstance(spec, ProbeSpec) and spec.filter and probe.kind.is_user:
            return f"{probe.label}: if {spec.filter}"
    return None


def _unsupported(
    engine: Engine, probes: Sequence[ResolvedProbe], *, auto: bool = False
) -> str | None:
    check = getattr(engine, "unsupported", None)
    if check is None:
        return None
    return check(probes, auto=True) if auto else check(probes)  # type: ignore[no-any-return]
