"""One entry point for every spec a user can write: kernel grammar or friendly form."""

from __future__ import annotations

import re

from probescope.errors import SpecError
from probescope.language.arch import Arch, host_arch
from probescope.language.fetchargs import LATEST
from probescope.language.friendly import FriendlyProbe, parse_friendly, parse_friendly_words
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_grammar import (
    EventsFile,
    _parse_event_name,
    check_definition_text,
    parse_kernel_probe,
    split_words,
)
from probescope.language.kernel_numbers import is_ascii_digit
from probescope.language.kinds import BY_ALIAS
from probescope.language.model import DeleteSpec, ProbeKind, ProbeSpec
from probescope.language.static_events import (
    FunctionSpec,
    TracepointSpec,
    parse_function,
    parse_tracepoint,
)
from probescope.language.usdt_spec import UsdtSpec, parse_usdt

_KERNEL_HEAD = re.compile(r"^(p|r\d*|e)(:[^:]*)?$")
_FRIENDLY_KERNEL_VARIABLE = re.compile(r"(?<![\w$%@\\])(arg\d+|retval)(?![\w])")

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
) -> Spec:
    """Parse a probe spec in either form.

    Kernel grammar (`p:grp/ev /bin/bash:0x4245c0 %ip`) gives a ProbeSpec or DeleteSpec;
    the friendly form (`bash:readline`, `r:c:malloc`, `p:grp/ev ./prog:main+4 x=arg1`) gives a
    FriendlyProbe for the symbols layer to resolve; `k:SYM`/`kr:SYM` give kprobe ProbeSpecs.
    """
    arch = arch or host_arch()
    check_definition_text(text)
    words = split_words(text)
    if not words:
        raise SpecError("empty probe spec", spec=text, column=0, hint="e.g. bash:readline")
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
        return parse_usdt(text, words, colon + 1)
    return parse_friendly_words(text, words)


def _parse_friendly_kprobe(
    text: str,
    words: list[tuple[int, str]],
    kind: ProbeKind,
    arch: Arch,
    grammar: KernelGrammar,
) -> ProbeSpec:
    """`k:SYM[+OFF] ARGS` / `kr:SYM ARGS`: argN → $argN, retval → $retval, then the kernel
    grammar. Columns of errors still point into the user's text."""
    column, first = words[0]
    colon = first.find(":")
    location = first[colon + 1 :]
    if not location:
        raise SpecError(
            "missing kernel symbol after ':'",
            spec=text,
            column=column + colon + 1,
            hint="e.g. k:do_sys_openat2 or kr:vfs_read",
        )
    prefix = "r" if kind.is_return else "p"
    pieces = [prefix, location]
    for _, word in words[1:]:
        equals = word.find("=")
        name, body = (word[: equals + 1], word[equals + 1 :]) if equals >= 0 else ("", word)
        if not name and _FRIENDLY_KERNEL_VARIABLE.fullmatch(body.split(":", 1)[0]):
            name = body.split(":", 1)[0] + "="
        pieces.append(name + _FRIENDLY_KERNEL_VARIABLE.sub(r"$\1", body))
    kernel_text = " ".join(pieces)
    try:
        spec = parse_kernel_probe(
            kernel_text, events_file=EventsFile.KPROBE_EVENTS, arch=arch, grammar=grammar
        )
    except SpecError as error:
        raise SpecError(error.message, spec=text, column=None, hint=error.hint) from None
    assert isinstance(spec, ProbeSpec)
    return spec
