"""The grammar corpus (tests/integration/language/corpus.py) through the bpf compiler: every
definition the kernel accepts is moved onto a function of a program the test builds (its
arguments point at data of every kind) and traced by the tracefs engine — the kernel's own
fetches — and by the bpf engine; each either yields the same values on every hit, or is
refused by the bpf engine with a reason that names the argument."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from integration.bpf.harness import args_by_event, trace
from integration.language.corpus import uprobe_corpus
from probescope.engines.bpf.engine import BpfEngine
from probescope.errors import SpecError
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import (
    Immediate,
    Memory,
    ProbeKind,
    ProbeSpec,
    UprobeLocation,
    dereference_depth,
    innermost,
)
from probescope.symbols.resolve import resolve_specs
from probescope.symbols.table import SymbolTable
from probescope.system.kernel import RunningKernel

pytestmark = [pytest.mark.root, pytest.mark.slow]


def accepted_definitions(binary: Path) -> dict[str, str]:
    """Event name → the definition moved onto corpus_probe, for every corpus line the kernel
    accepts (the language differential test checks that probescope's parser agrees)."""
    grammar = RunningKernel.read().grammar
    offset = SymbolTable.for_path(binary).lookup("corpus_probe").offset
    moved: dict[str, str] = {}
    for number, template in enumerate(uprobe_corpus()):
        try:
            spec = parse_kernel_probe(
                template.replace("{P}", "/bin/true"),
                events_file=EventsFile.UPROBE_EVENTS,
                grammar=grammar,
            )
        except SpecError:
            continue
        if not isinstance(spec, ProbeSpec) or not isinstance(spec.location, UprobeLocation):
            continue
        if spec.kind not in (ProbeKind.UPROBE, ProbeKind.URETPROBE):
            continue
        name = f"e{number}"
        moved[name] = replace(
            spec,
            group="corpus",
            event=name,
            location=UprobeLocation(str(binary), offset),
            source=None,
        ).definition()
    return moved


def test_corpus_values_equal_the_kernels(values: Path, no_aslr: Path) -> None:
    definitions = accepted_definitions(values)
    assert len(definitions) >= 150
    engine = BpfEngine()
    refused: dict[str, str] = {}
    for name, text in definitions.items():
        reason = engine.unsupported(resolve_specs([text]))
        if reason is not None:
            refused[name] = reason
    for name, reason in refused.items():
        argument = definitions[name].split(" ", 2)[2] if definitions[name].count(" ") > 1 else ""
        assert reason and any(word in reason for word in argument.split()), (name, reason)
    compiled = [text for name, text in definitions.items() if name not in refused]
    assert len(compiled) >= 0.9 * len(definitions), refused

    argv = [str(no_aslr), str(values)]
    kernel_events, _ = trace("tracefs", compiled, argv)
    bpf_events, summary = trace("bpf", compiled, argv)
    assert summary.lost == 0
    kernel = args_by_event(kernel_events)
    ours = args_by_event(bpf_events)
    assert set(kernel) == {name for name in definitions if name not in refused}
    differences = {
        name: (definitions[name], kernel[name], ours.get(name))
        for name in kernel
        if ours.get(name) != kernel[name] and not unwritten_by_the_kernel(definitions[name])
    }
    assert not differences
    for name in kernel:
        if unwritten_by_the_kernel(definitions[name]):
            assert ours[name] == [(0,)] * 2, (definitions[name], ours[name])
    assert all(len(hits) == 2 for hits in kernel.values())


def unwritten_by_the_kernel(definition: str) -> bool:
    """One argument, a chain of dereferences from an address in the unmapped first page: the
    first dereference faults, and the kernel leaves the argument's slot of its per-CPU buffer
    unwritten — the record shows whatever an earlier hit left there. The bpf engine stores 0,
    as the ptrace engine does."""
    spec = parse_kernel_probe(definition, events_file=EventsFile.UPROBE_EVENTS)
    assert isinstance(spec, ProbeSpec)
    if len(spec.args) != 1:
        return False
    fetch = spec.args[0].fetch
    base = innermost(fetch)
    address = base.address if isinstance(base, Memory) else None
    if isinstance(base, Immediate):
        address = base.value
    chain = dereference_depth(fetch) + isinstance(base, Memory)
    return address is not None and address < 0x1000 and chain >= 2
