"""`usdt:TARGET:PROVIDER:NAME [ARGS] [if FILTER]`: a statically defined user-space tracepoint
(SDT note).

ARGS pick and retype the probe's own arguments: `arg2`, `path=arg1:string`, `arg3:x64`;
without ARGS every argument is fetched with the type its note gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from probescope.errors import SpecError
from probescope.language.fetch_types import parse_type
from probescope.language.fetchargs import LATEST
from probescope.language.filter_grammar import split_filter_tail
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_numbers import is_good_name
from probescope.language.model import ProbeKind

_ARG = re.compile(r"^(?:(?P<name>[^=]+)=)?arg(?P<index>\d+)(?::(?P<type>.+))?$")


@dataclass(frozen=True)
class UsdtArgChoice:
    name: str
    index: int  # 1-based, as in the note
    type: str | None
    column: int


@dataclass(frozen=True)
class UsdtSpec:
    target: str
    provider: str  # may be a glob
    name: str  # may be a glob
    args: tuple[UsdtArgChoice, ...] = ()
    filter: str | None = None  # the `if EXPR` tail, over the arguments' names
    source: str | None = field(default=None, compare=False)
    target_column: int = 0
    probe_column: int = 0
    kind: ProbeKind = ProbeKind.USDT

    def __str__(self) -> str:
        return f"usdt:{self.target}:{self.provider}:{self.name}"


def parse_usdt(
    text: str, words: list[tuple[int, str]], prefix_len: int, grammar: KernelGrammar = LATEST
) -> UsdtSpec:
    column, first = words[0]
    body = first[prefix_len:]
    parts = body.rsplit(":", 2)
    if len(parts) != 3 or not all(parts):
        raise SpecError(
            f"{body!r} is not TARGET:PROVIDER:NAME",
            spec=text,
            column=column + prefix_len,
            hint="e.g. usdt:/usr/bin/python3.11:python:gc__start (list them with "
            "`probescope list usdt TARGET`)",
        )
    target, provider, name = parts
    choices = []
    used: set[str] = set()
    arg_words, filter_text = split_filter_tail(text, words[1:])
    for arg_column, word in arg_words:
        match = _ARG.match(word)
        if match is None or int(match.group("index")) == 0:
            raise SpecError(
                f"{word!r} does not name a probe argument",
                spec=text,
                column=arg_column,
                hint="USDT arguments are arg1..argN, optionally NAME=argN and :TYPE "
                "(e.g. path=arg1:string)",
            )
        index = int(match.group("index"))
        arg_name = match.group("name") or f"arg{index}"
        if not is_good_name(arg_name) or arg_name in used:
            raise SpecError(
                f"bad or repeated argument name {arg_name!r}", spec=text, column=arg_column
            )
        used.add(arg_name)
        type_text = match.group("type")
        if (
            type_text is not None
            and parse_type(type_text.split("[", 1)[0], grammar, user=True) is None
        ):
            raise SpecError(
                f"unknown type {type_text!r}",
                spec=text,
                column=arg_column + match.start("type"),
                hint="types: u8..u64, s8..s64, x8..x64, char, string, ustring, "
                "b<w>@<o>/<c>, TYPE[N]",
            )
        choices.append(UsdtArgChoice(arg_name, index, type_text, arg_column))
    return UsdtSpec(
        target=target,
        provider=provider,
        name=name,
        args=tuple(choices),
        filter=filter_text,
        source=text,
        target_column=column + prefix_len,
        probe_column=column + prefix_len + len(target) + 1,
    )
