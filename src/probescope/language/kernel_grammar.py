"""The kernel's dynamic-event grammar: one definition line of uprobe_events, kprobe_events or
dynamic_events parsed into a ProbeSpec (or DeleteSpec), accepting exactly what the kernel accepts.

The parser follows `__trace_uprobe_create`, `__trace_kprobe_create`, `__trace_eprobe_create` and
`dyn_event_release` step by step — including their quirks (`r5:ev` on a uprobe keeps an auto
name; a leading `0` is octal) — because probescope's promise is "the kernel's own grammar".
It also refuses, before the kernel sees them, strings that could smuggle a second definition or
a comment into a tracefs file.
"""

from __future__ import annotations

from enum import StrEnum

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import Arch, host_arch
from probescope.language.fetchargs import LATEST, MAX_TRACE_ARGS, ParseFlags, parse_fetchargs
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_numbers import (
    UINT_MAX,
    is_ascii_digit,
    is_good_name,
    is_good_system_name,
    kstrtol,
    kstrtouint,
    kstrtoul,
)
from probescope.language.model import (
    DeleteSpec,
    EprobeLocation,
    FetchArg,
    KprobeLocation,
    ProbeKind,
    ProbeSpec,
    UprobeLocation,
)

MAX_EVENT_NAME_LEN = 64
KRETPROBE_MAXACTIVE_MAX = 4096
MAX_LINE_BYTES = 4094  # WRITE_BUFSIZE (4096) minus the newline and the terminating NUL
KERNEL_SPACE = " \t\n\v\f\r"
_FORBIDDEN = {
    "\n": "a newline would start a second definition",
    "\r": "a carriage return is not allowed in a definition",
    "\0": "a NUL byte would truncate the definition",
    "#": "'#' starts a comment in tracefs files; the rest of the line would be ignored",
    ";": "';' is not part of the grammar and is refused as a command separator",
}


class EventsFile(StrEnum):
    UPROBE_EVENTS = "uprobe_events"
    KPROBE_EVENTS = "kprobe_events"
    DYNAMIC_EVENTS = "dynamic_events"


class _NotThisType(Exception):
    """The kernel's -ECANCELED: this parser does not own the line; another probe type may."""


Words = list[tuple[int, str]]


def split_words(text: str) -> Words:
    """`argv_split`: words separated by the kernel's whitespace, with their columns."""
    words: Words = []
    start = -1
    for i, ch in enumerate(text):
        if ch in KERNEL_SPACE:
            if start >= 0:
                words.append((start, text[start:i]))
                start = -1
        elif start < 0:
            start = i
    if start >= 0:
        words.append((start, text[start:]))
    return words


def check_definition_text(text: str) -> None:
    """Refuse text that is unsafe to write into a tracefs command file."""
    for i, ch in enumerate(text):
        reason = _FORBIDDEN.get(ch)
        if reason is None and ((ord(ch) < 0x20 and ch not in " \t") or ord(ch) == 0x7F):
            reason = f"control character {ch!r} is not allowed in a definition"
        if reason is None and ord(ch) > 0x7F and b"\xa0" in ch.encode("utf-8"):
            reason = (
                f"{ch!r} contains the byte 0xa0, which the kernel treats as a space: "
                "it would split the word there"
            )
        if reason is not None:
            raise SpecError(f"refused character {ch!r}: {reason}", spec=text, column=i)
    size = len(text.encode("utf-8"))
    if size > MAX_LINE_BYTES:
        raise SpecError(
            f"definition is {size} bytes long; the kernel takes at most {MAX_LINE_BYTES}",
            spec=text,
            column=len(text) - 1,
        )


def parse_kernel_probe(
    text: str,
    *,
    events_file: EventsFile | str = EventsFile.DYNAMIC_EVENTS,
    arch: Arch | None = None,
    kprobes: bool = True,
    grammar: KernelGrammar = LATEST,
) -> ProbeSpec | DeleteSpec:
    """Parse one definition line as the kernel would when it is written to `events_file`.

    `kprobes=False` parses as a kernel without CONFIG_KPROBE_EVENTS does (dynamic_events then
    refuses kprobe lines). Raises SpecError (or SpecErrors for several bad args).
    """
    events_file = EventsFile(events_file)
    arch = arch or host_arch()
    check_definition_text(text)
    words = split_words(text)
    if not words:
        raise SpecError("empty probe definition", spec=text, column=0, hint=_GRAMMAR_HINT)
    head = words[0][1]
    if head.startswith("-"):
        return _parse_delete(text, words, events_file)
    parsers = {
        EventsFile.UPROBE_EVENTS: (_parse_uprobe,),
        EventsFile.KPROBE_EVENTS: (_parse_kprobe,),
        EventsFile.DYNAMIC_EVENTS: (
            ((_parse_kprobe,) if kprobes else ()) + (_parse_uprobe, _parse_eprobe)
        ),
    }[events_file]
    for parser in parsers:
        try:
            return parser(text, words, arch, grammar)
        except _NotThisType:
            continue
    raise _unrecognized(text, words, events_file, kprobes)


_GRAMMAR_HINT = (
    "uprobes: p[:[GRP/]EVENT] PATH:OFFSET[%return][(REF)] [ARGS]; "
    "kprobes: p[:[GRP/]EVENT] SYM[+OFFS]|ADDR [ARGS], r[MAXACTIVE][:[GRP/]EVENT] SYM [ARGS]; "
    "delete: -:[GRP/]EVENT"
)


def _unrecognized(text: str, words: Words, events_file: EventsFile, kprobes: bool) -> SpecError:
    head = words[0][1]
    if head[0] not in "pre":
        return SpecError(
            f"unknown probe type {head[0]!r}",
            spec=text,
            column=words[0][0],
            hint="definitions start with p (probe), r (return probe), e (event probe) "
            "or - (delete)",
        )
    if len(words) < 2:
        return SpecError(
            "missing probe location after the event name",
            spec=text,
            column=len(text.rstrip()),
            hint=_GRAMMAR_HINT,
        )
    column, location = words[1]
    if events_file is EventsFile.UPROBE_EVENTS or (
        events_file is EventsFile.DYNAMIC_EVENTS and not kprobes
    ):
        hint = "a uprobe location is PATH:OFFSET with a '/' in PATH and a numeric file offset"
        if "/" not in location:
            message = f"{location!r} is not a uprobe location: the path has no '/'"
            if not kprobes and events_file is EventsFile.DYNAMIC_EVENTS:
                message = f"{location!r} is not a uprobe location, and there are no kprobe events"
        else:
            colon = location.rfind(":")
            message = f"{location!r} is not a uprobe location: no numeric offset after ':'"
            if colon >= 0:
                column += colon + 1
                hint += "; to probe by symbol name use the friendly form, e.g. /bin/bash:readline"
        return SpecError(message, spec=text, column=column, hint=hint)
    return SpecError(
        f"{location!r} is not a kprobe location", spec=text, column=column, hint=_GRAMMAR_HINT
    )


def _parse_event_name(text: str, column: int, spec: str) -> tuple[str | None, str | None]:
    """`traceprobe_parse_event_name`: (group or None, event or None=auto)."""
    slash = text.find("/")
    if slash < 0:
        slash = text.find(".")
    group = None
    event = text
    if slash >= 0:
        if slash == 0:
            raise SpecError("group name is not specified before '/'", spec=spec, column=column)
        if slash + 1 > MAX_EVENT_NAME_LEN:
            raise SpecError(
                f"group name is too long ({slash} characters, at most {MAX_EVENT_NAME_LEN - 1})",
                spec=spec,
                column=column,
            )
        group = text[:slash]
        if not is_good_system_name(group):
            raise SpecError(
                f"group name {group!r} must follow the rules of C identifiers (and may use '-')",
                spec=spec,
                column=column,
            )
        event = text[slash + 1 :]
        column += slash + 1
    if event == "":
        if slash >= 0:
            return group, None
        raise SpecError(
            "event name is not specified after ':'",
            spec=spec,
            column=column,
            hint="write p:GROUP/EVENT, p:EVENT, or just p for an automatic name",
        )
    if len(event) >= MAX_EVENT_NAME_LEN:
        raise SpecError(
            f"event name is too long ({len(event)} characters, at most {MAX_EVENT_NAME_LEN - 1})",
            spec=spec,
            column=column,
        )
    if not is_good_name(event):
        raise SpecError(
            f"event name {event!r} must follow the rules of C identifiers",
            spec=spec,
            column=column,
            hint="use letters, digits and '_', not starting with a digit",
        )
    return group, event


def _check_arg_count(text: str, words: Words) -> None:
    if len(words) - 2 > MAX_TRACE_ARGS:
        raise SpecError(
            f"too many arguments ({len(words) - 2}; at most {MAX_TRACE_ARGS})",
            spec=text,
            column=words[2 + MAX_TRACE_ARGS][0],
        )


def _parse_args(text: str, words: Words, flags: ParseFlags, arch: Arch) -> tuple[FetchArg, ...]:
    args, errors = parse_fetchargs(text, words, flags=flags, arch=arch)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return args


def _parse_uprobe(text: str, words: Words, arch: Arch, grammar: KernelGrammar) -> ProbeSpec:
    head_column, head = words[0]
    if head[0] not in "pr" or len(words) < 2:
        raise _NotThisType
    is_return = head[0] == "r"
    event_text = head[2:] if head[1:2] == ":" else None
    column, location = words[1]
    if "/" not in location:
        raise _NotThisType
    colon = location.rfind(":")
    if colon < 0 or not is_ascii_digit(location[colon + 1 : colon + 2]):
        raise _NotThisType
    _check_arg_count(text, words)
    path = location[:colon]
    place = location[colon + 1 :]
    place_column = column + colon + 1

    ref_ctr_offset = None
    paren = place.find("(")
    if paren >= 0:
        close = place.find(")", paren)
        if close < 0:
            raise SpecError(
                "reference counter brace is not closed",
                spec=text,
                column=place_column + len(place),
                hint="write PATH:OFFSET(REF_OFFSET)",
            )
        if close != len(place) - 1:
            raise SpecError(
                "reference counter has a wrong suffix",
                spec=text,
                column=place_column + close + 1,
                hint="the (REF) must come last: PATH:OFFSET%return(REF)",
            )
        ref_ctr_offset = kstrtoul(place[paren + 1 : close])
        if ref_ctr_offset is None:
            raise SpecError(
                f"invalid reference counter offset {place[paren + 1 : close]!r}",
                spec=text,
                column=place_column + paren + 1,
            )
        place = place[:paren]
    percent = place.find("%")
    if percent >= 0:
        if place[percent:] != "%return":
            raise SpecError(
                f"invalid probe address suffix {place[percent:]!r}",
                spec=text,
                column=place_column + percent,
                hint="the only suffix is %return",
            )
        is_return = True
        place = place[:percent]
    offset = kstrtoul(place)
    if offset is None:
        hint = None
        if place.startswith("0") and place[1:2].isdigit():
            hint = "a leading 0 makes the kernel read the offset as octal; write 0x for hex"
        raise SpecError(
            f"invalid uprobe offset {place!r}", spec=text, column=place_column, hint=hint
        )

    group = event = None
    if event_text is not None:
        group, event = _parse_event_name(event_text, head_column + 2, text)
    flags = ParseFlags(user=True, is_return=is_return, grammar=grammar)
    for column, word in words[2:]:
        if word == "if":  # what the kernel refuses as a fetch argument; say what was meant
            raise SpecError(
                "a uprobe_events definition takes no filter",
                spec=text,
                column=column,
                hint="filter in the friendly form (TARGET:SYMBOL ARGS if EXPR) or with --filter",
            )
    args = _parse_args(text, words[2:], flags, arch)
    return ProbeSpec(
        kind=ProbeKind.URETPROBE if is_return else ProbeKind.UPROBE,
        location=UprobeLocation(path, offset, ref_ctr_offset or None),
        group=group,
        event=event,
        args=args,
        source=text,
    )


def _parse_kprobe(text: str, words: Words, arch: Arch, grammar: KernelGrammar) -> ProbeSpec:
    head_column, head = words[0]
    if head[0] not in "pr" or len(words) < 2:
        raise _NotThisType
    is_return = head[0] == "r"
    colon = head.find(":", 1)
    event_text = head[colon + 1 :] if colon >= 0 else None
    maxactive = None
    if is_ascii_digit(head[1:2]):
        if not is_return:
            raise SpecError(
                "maxactive is only for function exit (r probes)",
                spec=text,
                column=head_column + 1,
            )
        digits = head[1:colon] if colon >= 0 else head[1:]
        maxactive = kstrtouint(digits) if len(digits) <= MAX_EVENT_NAME_LEN - 1 else None
        if not maxactive:
            raise SpecError(
                f"invalid maxactive number {digits!r}", spec=text, column=head_column + 1
            )
        if maxactive > KRETPROBE_MAXACTIVE_MAX:
            raise SpecError(
                f"maxactive {maxactive} is too big (at most {KRETPROBE_MAXACTIVE_MAX})",
                spec=text,
                column=head_column + 1,
            )
    column, place = words[1]
    if "/" in place and ":" in place and kstrtoul(place) is None:
        raise _NotThisType
    location, is_return, function_entry = parse_kprobe_location(text, column, place, is_return)
    _check_arg_count(text, words)
    group = event = None
    if event_text is not None:
        group, event = _parse_event_name(event_text, head_column + colon + 1, text)
    flags = ParseFlags(
        user=False, is_return=is_return, function_entry=function_entry, grammar=grammar
    )
    args = _parse_args(text, words[2:], flags, arch)
    return ProbeSpec(
        kind=ProbeKind.KRETPROBE if is_return else ProbeKind.KPROBE,
        location=location,
        group=group,
        event=event,
        args=args,
        maxactive=(maxactive or grammar.default_maxactive) if is_return else None,
        source=text,
    )


def parse_kprobe_location(
    text: str, column: int, place: str, is_return: bool
) -> tuple[KprobeLocation, bool, bool]:
    """`[MOD:]SYM[+offs][%return]` or `MEMADDR` (at `column` of `text`): the location, whether
    the probe is a return probe, and whether it sits on a function's entry (TPARG_FL_FENTRY)."""
    address = kstrtoul(place)
    if address is not None:
        return KprobeLocation(address=address), is_return, False
    symbol = place
    percent = symbol.find("%")
    if percent >= 0:
        if symbol[percent:] != "%return":
            raise SpecError(
                f"invalid probe address suffix {symbol[percent:]!r}",
                spec=text,
                column=column + percent,
                hint="the only suffix is %return",
            )
        is_return = True
        symbol = symbol[:percent]
    split = next((i for i, c in enumerate(symbol) if c in "+-"), -1)
    sym_offset: int | None = 0
    if split >= 0:
        sym_offset = kstrtol(symbol[split:])
        symbol = symbol[:split]
    if sym_offset is None or sym_offset < 0 or sym_offset > UINT_MAX or not symbol:
        raise SpecError(
            f"invalid probed address or symbol {place!r}",
            spec=text,
            column=column,
            hint="write SYMBOL[+OFFSET] with a non-negative offset, or an address",
        )
    if is_return and sym_offset != 0:
        raise SpecError(
            "a return probe must be on a function entry",
            spec=text,
            column=column,
            hint=f"probe {symbol} itself (offset 0)",
        )
    module = None
    mod_colon = symbol.find(":")
    if mod_colon >= 0:
        module, symbol = symbol[:mod_colon], symbol[mod_colon + 1 :]
    location = KprobeLocation(symbol=symbol, offset=sym_offset, module=module)
    return location, is_return, not is_return and sym_offset == 0


def _parse_eprobe(text: str, words: Words, arch: Arch, grammar: KernelGrammar) -> ProbeSpec:
    head_column, head = words[0]
    if head[0] != "e" or len(words) < 2:
        raise _NotThisType
    group = event = None
    if head[1:2] == ":":
        group, event = _parse_event_name(head[2:], head_column + 2, text)
    column, attached = words[1]
    try:
        system, attached_event = _parse_event_name(attached, column, text)
    except SpecError:
        system = attached_event = None
    if not system or not attached_event:
        raise SpecError(
            f"{attached!r}: an event probe needs SYSTEM.EVENT of the event it attaches to",
            spec=text,
            column=column,
        )
    rest = words[2:]
    filter_text = None
    for i, (_, word) in enumerate(rest):
        if word == "if":
            if i + 1 >= len(rest):
                raise SpecError("no filter rule after 'if'", spec=text, column=rest[i][0])
            filter_text = " ".join(w for _, w in rest[i + 1 :])
            rest = rest[:i]
            break
    if len(rest) > MAX_TRACE_ARGS:
        raise SpecError("too many arguments", spec=text, column=rest[MAX_TRACE_ARGS][0])
    flags = ParseFlags(user=False, trace_event=True, grammar=grammar)
    args = _parse_args(text, rest, flags, arch)
    separator = "/" if "/" in attached else "."
    return ProbeSpec(
        kind=ProbeKind.EPROBE,
        location=EprobeLocation(system, attached_event, separator),
        group=group,
        event=event,
        args=args,
        filter=filter_text,
        source=text,
    )


def _parse_delete(text: str, words: Words, events_file: EventsFile) -> DeleteSpec:
    column, head = words[0]
    if head[1:2] != ":":
        raise SpecError("a delete command is -:[GROUP/]EVENT", spec=text, column=column + 1)
    name = head[2:]
    group = None
    slash = name.find("/")
    if slash >= 0:
        group, name = name[:slash], name[slash + 1 :]
    if group is None and name == "":
        raise SpecError("no event to delete after '-:'", spec=text, column=column + 2)
    return DeleteSpec(
        group=group, event=name or None, words=tuple(w for _, w in words[1:]), source=text
    )
