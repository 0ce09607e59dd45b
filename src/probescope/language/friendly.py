"""The friendly form: `[p|r][:GRP/EV] TARGET:SYMBOL[+OFF][%return] [ARGS]`.

A friendly probe names a function instead of a file offset and may use `argN` (the ABI's Nth
integer argument) and `retval` in its arguments. Parsing here is pure text; `symbols.resolve`
turns a FriendlyProbe into kernel-grammar ProbeSpecs, and nothing downstream sees this form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from probescope.errors import SpecError
from probescope.language.arch import Arch
from probescope.language.fetchargs import LATEST, MAX_TRACE_ARGS, ParseFlags, parse_fetcharg
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_grammar import (
    check_definition_text,
    split_words,
)
from probescope.language.kernel_numbers import is_good_name, kstrtoul
from probescope.language.kinds import BY_ALIAS
from probescope.language.model import FetchArg, ProbeKind

_FRIENDLY_VARIABLE = re.compile(r"(?<![\w$%@\\])\$?(arg(\d+)|retval)(?![\w])")


@dataclass(frozen=True)
class FriendlyArg:
    """One argument as written: `[NAME=]EXPR[:TYPE]`, EXPR may use argN and retval."""

    text: str
    column: int


@dataclass(frozen=True)
class FriendlyProbe:
    """A probe on a named function (or a raw offset) of a target still to be located."""

    kind: ProbeKind
    target: str
    symbol: str | None  # name or glob; None when `offset` is a raw file offset
    offset: int
    group: str | None
    event: str | None
    args: tuple[FriendlyArg, ...]
    source: str
    target_column: int
    symbol_column: int

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
) -> FriendlyProbe:
    """Parse the location and args of a friendly probe whose head is already known."""
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
        plus = place.find("+")
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
        bad = next(
            (i for i, c in enumerate(symbol) if not (c.isprintable() and c not in " ()")), -1
        )
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
    probe_kind = ProbeKind.URETPROBE if is_return else ProbeKind.UPROBE
    return FriendlyProbe(
        kind=probe_kind,
        target=target,
        symbol=symbol,
        offset=offset,
        group=group,
        event=event,
        args=tuple(FriendlyArg(word, column) for column, word in args),
        source=text,
        target_column=location_column,
        symbol_column=place_column,
    )


def lower_args(
    probe: FriendlyProbe, arch: Arch, *, on_entry: bool, grammar: KernelGrammar = LATEST
) -> tuple[FetchArg, ...]:
    """Translate friendly args into kernel fetchargs for a uprobe on `arch`.

    `argN` becomes the ABI register (or `$stackK` past the register args, at function entry
    only), `retval` becomes `$retval`; a bare `argN`/`retval` also names the argument.
    """
    lowered: list[FetchArg] = []
    used: set[str] = set()
    flags = ParseFlags(user=True, is_return=probe.is_return, grammar=grammar)
    for index, arg in enumerate(probe.args):
        kernel_text, name = _lower_one(probe, arg, arch, on_entry=on_entry, index=index)
        if name is not None and "=" not in arg.text and name not in used:
            kernel_text = f"{name}={kernel_text}"
        fetcharg = parse_fetcharg(
            kernel_text,
            index,
            flags=flags,
            arch=arch,
            spec=kernel_text,
            column=0,
            used_names=frozenset(used),
        )
        used.add(fetcharg.name)
        lowered.append(fetcharg)
    return tuple(lowered)


def _lower_one(
    probe: FriendlyProbe, arg: FriendlyArg, arch: Arch, *, on_entry: bool, index: int
) -> tuple[str, str | None]:
    text = arg.text
    equals = text.find("=")
    prefix, body = (text[: equals + 1], text[equals + 1 :]) if equals >= 0 else ("", text)
    if body.startswith('\\"'):
        return text, None
    colon = body.find(":")
    fetch, type_suffix = (body[:colon], body[colon:]) if colon >= 0 else (body, "")
    body_column = arg.column + len(prefix)
    implicit_name = None
    bare = _FRIENDLY_VARIABLE.fullmatch(fetch)
    if bare and not prefix:
        implicit_name = bare.group(1)

    def substitute(match: re.Match[str]) -> str:
        column = body_column + match.start()
        if match.group(1) == "retval":
            if not probe.is_return:
                raise SpecError(
                    "retval is only available in a return probe",
                    spec=probe.source,
                    column=column,
                    hint="write r:TARGET:SYMBOL or TARGET:SYMBOL%return",
                )
            return "$retval"
        number = int(match.group(2))
        if number == 0:
            raise SpecError("arguments count from arg1", spec=probe.source, column=column)
        if probe.is_return:
            raise SpecError(
                f"arg{number} is not available in a return probe: uprobes cannot carry entry "
                "arguments to the return",
                spec=probe.source,
                column=column,
                hint="add an entry probe on the same function for its arguments",
            )
        register = arch.arg_register(number)
        if register is not None:
            return f"%{register}"
        if not on_entry:
            raise SpecError(
                f"arg{number} is passed on the stack and can only be read at the function's "
                "first instruction",
                spec=probe.source,
                column=column,
            )
        # At entry x86_64 has the return address at $stack0; arm64 keeps it in lr.
        slot = number - len(arch.arg_registers) - (0 if arch.name == "x86_64" else 1)
        return f"$stack{slot}"

    lowered = _FRIENDLY_VARIABLE.sub(substitute, fetch)
    if implicit_name is not None and not is_good_name(implicit_name):
        implicit_name = None
    return prefix + lowered + type_suffix, implicit_name


def parse_friendly_words(text: str, words: list[tuple[int, str]]) -> FriendlyProbe:
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
    )


__all__ = [
    "FriendlyArg",
    "FriendlyProbe",
    "check_definition_text",
    "lower_args",
    "parse_friendly",
    "parse_friendly_words",
    "split_target",
    "split_words",
]
