"""The friendly form: `[p|r][:GRP/EV] TARGET:SYMBOL[+OFF][%return] [ARGS] [if FILTER]`.

A friendly probe names a function instead of a file offset and may use `argN` (the ABI's Nth
integer argument) and `retval` in its arguments. The function may be named as C++ and Rust
demangle it (`./prog:ns::Class::method(int, char const*)`): its brackets may hold spaces, and
a `+` of an operator's name (`operator+=`) is not an offset. Everything is parsed here,
arguments included (into the FetchArg AST, `argN` and `retval` as AbiArgument and
FriendlyReturnValue nodes that keep their columns); `symbols.resolve` locates the target and
lowers the arguments (language/lowering.py) into kernel-grammar ProbeSpecs, and nothing
downstream sees this form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import Arch
from probescope.language.fetchargs import LATEST, MAX_TRACE_ARGS, ParseFlags, parse_fetchargs
from probescope.language.filter_grammar import split_filter_tail
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_numbers import kstrtoul
from probescope.language.kinds import BY_ALIAS
from probescope.language.lowering import Place, lower_fetchargs
from probescope.language.model import FetchArg, ProbeKind


@dataclass(frozen=True)
class FriendlyProbe:
    """A probe on a named function (or a raw offset) of a target still to be located.

    `args` are parsed and checked; their `argN`/`retval` are lowered once the place is known.
    """

    kind: ProbeKind
    target: str
    symbol: str | None  # name or glob; None when `offset` is a raw file offset
    offset: int
    group: str | None
    event: str | None
    args: tuple[FetchArg, ...]
    source: str
    target_column: int
    symbol_column: int
    filter: str | None = None  # the `if EXPR` tail (the kernel's filter grammar), as typed

    @property
    def is_return(self) -> bool:
        return self.kind.is_return

    @property
    def is_glob(self) -> bool:
        return self.symbol is not None and any(c in self.symbol for c in "*?[")


def split_target(location: str) -> tuple[str, str] | None:
    """`TARGET:SYMBOL` split at the first ':' after the last '/' (paths may hold ':')."""
    slash = location.rfind("/")
    colon = location.find(":", slash + 1)
    if colon <= 0:
        return None
    return location[:colon], location[colon + 1 :]


def parse_friendly(
    text: str,
    *,
    kind: ProbeKind,
    group: str | None,
    event: str | None,
    location: str,
    location_column: int,
    args: list[tuple[int, str]],
    arch: Arch,
    grammar: KernelGrammar = LATEST,
    diagnostics: list[SpecError] | None = None,
) -> FriendlyProbe:
    """Parse the location and args of a friendly probe whose head is already known.

    Errors in the arguments are collected; with `diagnostics` they are appended there and the
    probe comes back with the arguments that parsed (so that its target can still be checked),
    without it they are raised.
    """
    location, args = _whole_location(text, location, location_column, args)
    args, filter_text = split_filter_tail(text, args)
    split = split_target(location)
    if split is None:
        raise SpecError(
            f"{location!r} names no function: expected TARGET:SYMBOL",
            spec=text,
            column=location_column,
            hint="e.g. bash:readline, c:malloc, ./prog:main+4, /usr/bin/python3:0x1234",
        )
    target, place = split
    place_column = location_column + len(target) + 1
    if not target:
        raise SpecError("missing target before ':'", spec=text, column=location_column)
    is_return = kind.is_return
    if place.endswith("%return"):
        is_return = True
        place = place[: -len("%return")]
    elif "%" in place:
        raise SpecError(
            f"invalid suffix {place[place.index('%') :]!r}",
            spec=text,
            column=place_column + place.index("%"),
            hint="the only suffix is %return",
        )
    if not place:
        raise SpecError(
            "missing symbol after ':'", spec=text, column=place_column, hint="e.g. bash:readline"
        )
    symbol: str | None
    offset = 0
    if place[0].isdigit():
        raw = kstrtoul(place)
        if raw is None:
            raise SpecError(
                f"invalid offset {place!r}",
                spec=text,
                column=place_column,
                hint="a raw file offset is decimal or 0x hex",
            )
        symbol, offset = None, raw
    else:
        plus = _offset_plus(place)
        symbol = place if plus < 0 else place[:plus]
        if plus >= 0:
            raw = kstrtoul(place[plus + 1 :])
            if raw is None:
                raise SpecError(
                    f"invalid offset {place[plus + 1 :]!r} after '+'",
                    spec=text,
                    column=place_column + plus + 1,
                    hint="write SYMBOL+OFFSET with a decimal or 0x hex offset",
                )
            offset = raw
        bad = next((i for i, c in enumerate(symbol) if not c.isprintable()), -1)
        if not symbol or bad >= 0:
            raise SpecError(
                f"invalid symbol {symbol!r}", spec=text, column=place_column + max(bad, 0)
            )
    if is_return and offset and symbol is not None:
        raise SpecError(
            "a return probe must be on a function's first instruction",
            spec=text,
            column=place_column,
            hint=f"probe {symbol}%return without +{offset}",
        )
    if len(args) > MAX_TRACE_ARGS:
        raise SpecError("too many arguments", spec=text, column=args[MAX_TRACE_ARGS][0])
    flags = ParseFlags(user=True, is_return=is_return, grammar=grammar, friendly=True)
    parsed, errors = parse_fetchargs(text, args, flags=flags, arch=arch)
    if errors and diagnostics is None:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    if diagnostics is not None:
        diagnostics += errors
    return FriendlyProbe(
        kind=ProbeKind.URETPROBE if is_return else ProbeKind.UPROBE,
        target=target,
        symbol=symbol,
        offset=offset,
        group=group,
        event=event,
        args=parsed,
        source=text,
        target_column=location_column,
        symbol_column=place_column,
        filter=filter_text,
    )


_OPERATOR_TOKEN = re.compile(r"operator\s*(<<=|>>=|<=>|<<|>>|<=|>=|->\*|->|<|>|\(\)|\+\+|\+)")


def _open_brackets(text: str) -> int:
    """How many `(` and `<` of a demangled name are still open at its end (operator names
    such as `operator<` and `operator()` are not brackets)."""
    text = _OPERATOR_TOKEN.sub("operator", text)
    parens = text.count("(") - text.count(")")
    angles = text.count("<") - text.count(">")
    return max(parens, 0) + max(angles, 0)


def _whole_location(
    text: str, location: str, location_column: int, args: list[tuple[int, str]]
) -> tuple[str, list[tuple[int, str]]]:
    """The location and the arguments after it: a location whose brackets are still open
    (`./prog:ns::f(int,` `char)`) runs on through the words that close them."""
    taken = 0
    while taken < len(args) and ":" in location and _open_brackets(location) > 0:
        column, word = args[taken]
        location = text[location_column : column + len(word)]
        taken += 1
    return location, args[taken:]


def _offset_plus(place: str) -> int:
    """Where `SYMBOL+OFFSET` splits: the last `+`, unless it belongs to an operator's name
    (`operator+`, `operator++(int)`, `operator+=(T)`); -1 when there is no offset."""
    plus = place.rfind("+")
    if plus <= 0:
        return -1
    if re.search(r"operator\s*\+\+?$", place[: plus + 1]) or not re.fullmatch(
        r"\w*", place[plus + 1 :]
    ):
        return -1
    return plus


def lower_args(
    probe: FriendlyProbe, arch: Arch, *, on_entry: bool, go_abi: bool = False
) -> tuple[FetchArg, ...]:
    """The probe's arguments as a uprobe on `arch` fetches them (see language/lowering.py);
    `on_entry`: the probe sits on the function's first instruction; `go_abi`: in a Go
    function that takes Go's register ABI."""
    place = Place(arch=arch, user=True, on_entry=on_entry, go_abi=go_abi)
    return lower_fetchargs(probe.args, place, spec=probe.source)


def parse_friendly_words(
    text: str,
    words: list[tuple[int, str]],
    *,
    arch: Arch,
    grammar: KernelGrammar = LATEST,
    diagnostics: list[SpecError] | None = None,
) -> FriendlyProbe:
    """The friendly form when its first word is the location (`bash:readline`,
    `r:bash:readline`, `uprobe:c:malloc`)."""
    column, first = words[0]
    colon = first.find(":")
    kind = ProbeKind.UPROBE
    location, location_column = first, column
    alias = first[:colon] if colon > 0 else ""
    probe_type = BY_ALIAS.get(alias)
    if probe_type is not None and first.count(":") >= 2 and probe_type.kind.is_user:
        kind = probe_type.kind
        location = first[colon + 1 :]
        location_column = column + colon + 1
    return parse_friendly(
        text,
        kind=kind,
        group=None,
        event=None,
        location=location,
        location_column=location_column,
        args=words[1:],
        arch=arch,
        grammar=grammar,
        diagnostics=diagnostics,
    )
