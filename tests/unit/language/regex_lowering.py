"""The friendly arguments' old lowering, kept as the oracle of the AST lowering's property test.

Before arguments were parsed into the AST, `argN`/`retval` were replaced in the text with a
regex and the result re-parsed in the kernel's grammar; the AST lowering must give the same
ProbeSpec wherever that path gave one. Only the text rewriting lives here: the re-parse uses the
kernel-grammar parser, which the live differential tests check against the kernel.
"""

from __future__ import annotations

import re

from probescope.errors import SpecError
from probescope.language.arch import Arch
from probescope.language.fetchargs import ParseFlags, parse_fetcharg
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe, split_words
from probescope.language.model import FetchArg, ProbeSpec

_FRIENDLY_VARIABLE = re.compile(r"(?<![\w$%@\\])\$?(arg(\d+)|retval)(?![\w])")
_FRIENDLY_KERNEL_VARIABLE = re.compile(r"(?<![\w$%@\\])(arg\d+|retval)(?![\w])")


def lower_uprobe_args(
    words: list[str], arch: Arch, *, is_return: bool, on_entry: bool, grammar: KernelGrammar
) -> tuple[FetchArg, ...]:
    """A friendly uprobe's argument words lowered the old way (text, then the kernel parser)."""
    lowered: list[FetchArg] = []
    used: set[str] = set()
    flags = ParseFlags(user=True, is_return=is_return, grammar=grammar)
    for index, text in enumerate(words):
        kernel_text, name = _lower_one(text, arch, is_return=is_return, on_entry=on_entry)
        if name is not None and "=" not in text and name not in used:
            kernel_text = f"{name}={kernel_text}"
        fetcharg = parse_fetcharg(
            kernel_text, index, flags=flags, arch=arch, used_names=frozenset(used)
        )
        used.add(fetcharg.name)
        lowered.append(fetcharg)
    return tuple(lowered)


def _lower_one(text: str, arch: Arch, *, is_return: bool, on_entry: bool) -> tuple[str, str | None]:
    equals = text.find("=")
    prefix, body = (text[: equals + 1], text[equals + 1 :]) if equals >= 0 else ("", text)
    if body.startswith('\\"'):
        return text, None
    colon = body.find(":")
    fetch, type_suffix = (body[:colon], body[colon:]) if colon >= 0 else (body, "")
    bare = _FRIENDLY_VARIABLE.fullmatch(fetch)
    implicit_name = bare.group(1) if bare and not prefix else None

    def substitute(match: re.Match[str]) -> str:
        if match.group(1) == "retval":
            if not is_return:
                raise SpecError("retval is only available in a return probe")
            return "$retval"
        number = int(match.group(2))
        if number == 0:
            raise SpecError("arguments count from arg1")
        if is_return:
            raise SpecError(f"arg{number} is not available in a return probe")
        register = arch.arg_register(number)
        if register is not None:
            return f"%{register}"
        if not on_entry:
            raise SpecError(f"arg{number} is passed on the stack")
        slot = number - len(arch.arg_registers) - (0 if arch.name == "x86_64" else 1)
        return f"$stack{slot}"

    return prefix + _FRIENDLY_VARIABLE.sub(substitute, fetch) + type_suffix, implicit_name


def parse_friendly_kprobe(text: str, arch: Arch, grammar: KernelGrammar) -> ProbeSpec:
    """`k:SYM ARGS` / `kr:SYM ARGS` the old way: `$` put before argN/retval, then the kernel
    grammar's parser on the rewritten line."""
    words = split_words(text)
    first = words[0][1]
    colon = first.find(":")
    pieces = ["r" if first.startswith("kr") else "p", first[colon + 1 :]]
    for _, word in words[1:]:
        equals = word.find("=")
        name, body = (word[: equals + 1], word[equals + 1 :]) if equals >= 0 else ("", word)
        if not name and _FRIENDLY_KERNEL_VARIABLE.fullmatch(body.split(":", 1)[0]):
            name = body.split(":", 1)[0] + "="
        pieces.append(name + _FRIENDLY_KERNEL_VARIABLE.sub(r"$\1", body))
    spec = parse_kernel_probe(
        " ".join(pieces), events_file=EventsFile.KPROBE_EVENTS, arch=arch, grammar=grammar
    )
    assert isinstance(spec, ProbeSpec)
    return spec
