"""The one registry of probe types: kernel prefix, events file and friendly spellings.

The parser, the friendly form, the engines and the CLI's help all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from probescope.language.model import ProbeKind


@dataclass(frozen=True)
class ProbeType:
    kind: ProbeKind
    prefix: str  # the kernel grammar's first character
    events_file: str  # where the kernel takes its definitions
    aliases: tuple[str, ...]  # friendly prefixes: `ur:bash:readline`
    description: str


PROBE_TYPES: tuple[ProbeType, ...] = (
    ProbeType(
        ProbeKind.UPROBE,
        "p",
        "uprobe_events",
        ("p", "u", "uprobe"),
        "user function entry or instruction",
    ),
    ProbeType(
        ProbeKind.URETPROBE, "r", "uprobe_events", ("r", "ur", "uretprobe"), "user function return"
    ),
    ProbeType(
        ProbeKind.KPROBE,
        "p",
        "kprobe_events",
        ("k", "kprobe"),
        "kernel function entry or instruction",
    ),
    ProbeType(
        ProbeKind.KRETPROBE, "r", "kprobe_events", ("kr", "kretprobe"), "kernel function return"
    ),
    ProbeType(ProbeKind.EPROBE, "e", "dynamic_events", (), "event probe on a trace event"),
    ProbeType(
        ProbeKind.TRACEPOINT,
        "",
        "set_event",
        ("t", "tracepoint"),
        "kernel tracepoint (trace event)",
    ),
    ProbeType(
        ProbeKind.USDT, "p", "uprobe_events", ("usdt",), "user statically defined tracepoint"
    ),
    ProbeType(
        ProbeKind.FUNCTION, "", "set_ftrace_filter", ("f", "function"), "kernel function tracer"
    ),
)

BY_ALIAS: dict[str, ProbeType] = {alias: t for t in PROBE_TYPES for alias in t.aliases}
BY_KIND: dict[ProbeKind, ProbeType] = {t.kind: t for t in PROBE_TYPES}
