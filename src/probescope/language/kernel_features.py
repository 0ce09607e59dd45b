"""What a given kernel's probe grammar accepts, where versions differ.

The grammar grew over the years: the `char` type (6.5), `symstr` (6.2), `%pd` (6.4),
`$retval` matched by prefix for BTF field access (6.6), an error instead of silent truncation
beyond 128 args (6.7), `$argN` in kretprobes and uprobes refusing the kernel-only
`symbol`/`symstr` types (6.10).
Types are read from the kernel's own tracefs README when it is at hand (the kernel lists what it
knows); the rest follows the release. Verified against 6.1 and 6.18 (tests/vm, tests/integration).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALL_TYPES = frozenset(
    [f"{s}{b}" for s in "usx" for b in (8, 16, 32, 64)]
    + ["char", "string", "ustring", "symbol", "symstr", "bitfield"]
)
_TYPES_SINCE = {"char": (6, 5), "symstr": (6, 2)}


def parse_release(release: str) -> tuple[int, int]:
    """(major, minor) of a `uname -r` string; unknown forms count as very new."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (99, 0)


@dataclass(frozen=True)
class KernelGrammar:
    release: tuple[int, int]
    types: frozenset[str]
    retval_prefix: bool  # `$retvalX` accepted (6.6+: `$retval` parsed for BTF fields)
    refuses_symbol_types_on_uprobes: bool  # 6.10+
    refuses_excess_args: bool  # 6.7+; older kernels silently drop args past 128
    args_on_return: bool = True  # $argN in kretprobes (entry data, 6.10+)
    # What a kretprobe without MAXACTIVE shows: register_kretprobe sets max(10, 2 * possible
    # CPUs), and kprobe_events prints it. None when the machine is not known.
    default_maxactive: int | None = None

    @classmethod
    def latest(cls) -> KernelGrammar:
        return cls.for_release("99.0")

    @classmethod
    def for_release(
        cls, release: str, readme: str | None = None, *, possible_cpus: int | None = None
    ) -> KernelGrammar:
        version = parse_release(release)
        types = {t for t in ALL_TYPES if version >= _TYPES_SINCE.get(t, (0, 0))}
        if readme is not None:
            listed = _readme_types(readme)
            if listed:
                types = {t for t in ALL_TYPES if t in listed or t[0] in "usx" or t == "bitfield"}
        return cls(
            release=version,
            types=frozenset(types),
            retval_prefix=version >= (6, 6),
            refuses_symbol_types_on_uprobes=version >= (6, 10),
            refuses_excess_args=version >= (6, 7),
            args_on_return=version >= (6, 10),
            default_maxactive=None if possible_cpus is None else max(10, 2 * possible_cpus),
        )


def _readme_types(readme: str) -> set[str]:
    """The names in the README's `type:` list of the probe-events section."""
    match = re.search(r"\n\s*type: (.*?)\n\s*(?:\w+:|\S+\s+-)", readme, re.S)
    if not match:
        return set()
    return {word.strip(" ,") for word in re.split(r"[,\s]+", match.group(1)) if word}
