"""One entry point for every spec a user can write: kernel grammar or friendly form."""

from __future__ import annotations

import re
from dataclasses import replace

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import Arch, host_arch
from probescope.language.event_filter import parse_filter
from probescope.language.fetchargs import LATEST, MAX_TRACE_ARGS, ParseFlags, parse_fetchargs
from probescope.language.friendly import FriendlyProbe, parse_friendly, parse_friendly_words
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_grammar import (
    _parse_event_name,
    check_definition_text,
    parse_kernel_probe,
    parse_kprobe_location,
    split_words,
)
from probescope.language.kernel_numbers import is_ascii_digit, kstrtoul
from probescope.language.kinds import BY_ALIAS
from probescope.language.lowering import Place, lower_fetchargs
from probescope.language.model import DeleteSpec, ProbeKind, ProbeSpec
from probescope.language.static_events import (
    FunctionSpec,
    TracepointSpec,
    parse_function,
    parse_tracepoint,
)
from probescope.language.usdt_spec import UsdtSpec, parse_usdt

_KERNEL_HEAD = re.compile(r"^(p|r\d*|e)(:[^:]*)?$")

Spec = ProbeSpec | DeleteSpec | FriendlyProbe | TracepointSpec | FunctionSpec | UsdtSpec


def is_kernel_uprobe_location(word: str) -> bool:
    """The kernel's test: a '/' somewhere and a digit right after the last ':'."""
    colon = word.rfind(":")
    return "/" in word and colon >= 0 and is_ascii_digit(word[colon + 1 : colon + 2])


def parse_probe(
    text: str,
    *,
    arch: Arch | None = None,
    kprobes: bool = True,
    grammar: KernelGrammar = LATEST,
    diagnostics: list[SpecError] | None = None,
) -> Spec:
    """Parse a probe spec in either form, arguments included.

    Kernel grammar (`p:grp/ev /bin/bash:0x4245c0 %ip`) gives a ProbeSpec or DeleteSpec;
    the friendly form (`bash:readline`, `r:c:malloc`, `p:grp/ev ./prog:main+4 x=arg1`) gives a
    FriendlyProbe for the symbols layer to resolve; `k:SYM`/`kr:SYM` give kprobe ProbeSpecs.
    With `diagnostics`, errors in a friendly probe's arguments are appended there instead of
    raised, and the probe is returned so that its target can be checked too (collect, then
    fail); every other error is raised.
    """
    arch = arch or host_arch()
    check_definition_text(text)
    words = split_words(text)
    if not words:
        raise SpecError("empty probe spec", spec=text, column=0, hint="e.g. bash:readline")
    split = _split_filter(text, words)
    if split is not None:
        unfiltered, filter_text = split
        spec = parse_probe(
            unfiltered, arch=arch, kprobes=kprobes, grammar=grammar, diagnostics=diagnostics
        )
        if isinstance(spec, ProbeSpec | FriendlyProbe | UsdtSpec):
            return replace(spec, source=text, filter=filter_text)
        return spec
    column, first = words[0]
    if first.startswith("-"):
        return parse_kernel_probe(text, arch=arch, kprobes=kprobes, grammar=grammar)
    head = _KERNEL_HEAD.match(first)
    if head and len(words) >= 2:
        location_column, location = words[1]
        if is_kernel_uprobe_location(location) or ":" not in location or first[0] == "e":
            return parse_kernel_probe(text, arch=arch, kprobes=kprobes, grammar=grammar)
        group = event = None
        if head.group(2):
            group, event = _parse_event_name(head.group(2)[1:], column + 2, text)
        return parse_friendly(
            text,
            kind=ProbeKind.URETPROBE if first[0] == "r" else ProbeKind.UPROBE,
            group=group,
            event=event,
            location=location,
            location_column=location_column,
            args=words[2:],
            arch=arch,
            grammar=grammar,
            diagnostics=diagnostics,
        )
    if head:
        return parse_kernel_probe(text, arch=arch, kprobes=kprobes, grammar=grammar)
    colon = first.find(":")
    probe_type = BY_ALIAS.get(first[:colon]) if colon > 0 else None
    if probe_type is not None and probe_type.kind.is_kernel:
        return _parse_friendly_kprobe(text, words, probe_type.kind, arch, grammar)
    if probe_type is not None and probe_type.kind is ProbeKind.TRACEPOINT:
        return parse_tracepoint(text, words, colon + 1)
    if probe_type is not None and probe_type.kind is ProbeKind.FUNCTION:
        return parse_function(text, words, colon + 1)
    if probe_type is not None and probe_type.kind is ProbeKind.USDT:
        return parse_usdt(text, words, colon + 1, grammar)
    return parse_friendly_words(text, words, arch=arch, grammar=grammar, diagnostics=diagnostics)


def _split_filter(text: str, words: list[tuple[int, str]]) -> tuple[str, str] | None:
    """`SPEC if FILTER` of a probe that takes its filter apart from its definition (uprobes,
    kprobes, USDT: the filter goes to the event's `filter` file, or is evaluated by the
    engine): (SPEC, FILTER), or None. Tracepoints and event probes parse their own `if`."""
    at = next((i for i, (_, word) in enumerate(words) if word == "if" and i > 0), None)
    if at is None:
        return None
    first = words[0][1]
    if first.startswith("-") or (first[0] == "e" and _KERNEL_HEAD.match(first)):
        return None
    colon = first.find(":")
    alias = BY_ALIAS.get(first[:colon]) if colon > 0 else None
    if alias is not None and alias.kind in (ProbeKind.TRACEPOINT, ProbeKind.FUNCTION):
        return None
    if at + 1 >= len(words):
        raise SpecError(
            "no filter expression after 'if'",
            spec=text,
            column=words[at][0],
            hint="e.g. bash:readline if common_pid == 42, or ./prog:f x=arg1:s32 if x > 2",
        )
    start = words[at + 1][0]
    expression = text[start:].rstrip()
    # Checked here, so a syntax error points into the spec as typed, before any target is
    # looked up; which fields it names is checked against the probe's arguments later.
    parse_filter(expression, spec=text, column=start)
    return text[: words[at][0]].rstrip(), expression


def _parse_friendly_kprobe(
    text: str,
    words: list[tuple[int, str]],
    kind: ProbeKind,
    arch: Arch,
    grammar: KernelGrammar,
) -> ProbeSpec:
    """`k:SYM[+OFF] ARGS` / `kr:SYM ARGS`: the location in the kernel's grammar, arguments in
    the friendly form with `argN` lowered to `$argN` and `retval` to `$retval`."""
    column, first = words[0]
    colon = first.find(":")
    location_text = first[colon + 1 :]
    location_column = column + colon + 1
    if not location_text:
        raise SpecError(
            "missing kernel symbol after ':'",
            spec=text,
            column=location_column,
            hint="e.g. k:do_sys_openat2 or kr:vfs_read",
        )
    if "/" in location_text and ":" in location_text and kstrtoul(location_text) is None:
        raise SpecError(
            f"{location_text!r} is not a kprobe location",
            spec=text,
            column=location_column,
            hint="k:SYMBOL[+OFFSET], k:MODULE:SYMBOL or k:ADDRESS; for user space use "
            "TARGET:SYMBOL",
        )
    location, is_return, function_entry = parse_kprobe_location(
        text, location_column, location_text, kind.is_return
    )
    if len(words) - 1 > MAX_TRACE_ARGS:
        raise SpecError(
            f"too many arguments ({len(words) - 1}; at most {MAX_TRACE_ARGS})",
            spec=text,
            column=words[1 + MAX_TRACE_ARGS][0],
        )
    flags = ParseFlags(
        user=False,
        is_return=is_return,
        function_entry=function_entry,
        grammar=grammar,
        friendly=True,
    )
    args, errors = parse_fetchargs(text, words[1:], flags=flags, arch=arch)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return ProbeSpec(
        kind=ProbeKind.KRETPROBE if is_return else ProbeKind.KPROBE,
        location=location,
        args=lower_fetchargs(args, Place(arch=arch, user=False), spec=text),
        maxactive=grammar.default_maxactive if is_return else None,
        source=text,
    )
