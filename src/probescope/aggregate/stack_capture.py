"""What a probe must copy at each hit so its user stack can be walked later, in any engine.

Stacks are captured with the probe language itself: hidden fetch arguments (named `__ps_*`)
appended to each probe copy the registers an unwinder needs and the top of the stack
(`+0($stack):x64[64]`, `+512($stack):x64[64]` ...), so the tracefs, ptrace and any later engine
record the same sample and one user-space unwinder serves all. The kernel caps a uprobe's fixed
fields at 3072 bytes (measured on 6.18: "Event too big"), so the copy is at most 3008 bytes
after the eight registers; perf's `--call-graph dwarf` copies 8 KiB by default, so very deep
stacks are cut where the copy ends.

With `fp` on the tracefs engine the kernel walks the frame pointers itself
(`options/userstacktrace`, at most 8 entries, in a `user_stack` record after the event); the
probe then only copies the return address at [sp] (`$stack0`), which a walk started at a
function's first instruction misses.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from probescope.aggregate.unwind import StackSample
from probescope.errors import ProbescopeError
from probescope.events import HIDDEN_PREFIX, Event, EventType
from probescope.language.arch import Arch, host_arch
from probescope.language.fetchargs import ParseFlags, parse_fetcharg
from probescope.language.model import FetchArg, ProbeSpec
from probescope.language.resolved import ResolvedProbe

METHODS = ("dwarf", "fp")
MAX_PROBE_FIELDS = 3072
"""Bytes of fixed fields the kernel allows a probe event (beyond its ip)."""
MAX_SNAPSHOT = 3008
ARRAY_LIMIT = 64
"""Elements of one fetch-argument array (the kernel's MAX_ARRAY_LEN)."""

REGISTERS: tuple[tuple[str, int], ...] = (
    ("ip", 16),
    ("sp", 7),
    ("bp", 6),
    ("bx", 3),
    ("r12", 12),
    ("r13", 13),
    ("r14", 14),
    ("r15", 15),
)
"""Registers copied with a stack (kernel name, DWARF number): the pc, the stack and frame
pointers and the other callee-saved registers a CFA or a caller's register may live in."""
RETURN_ADDRESS = f"{HIDDEN_PREFIX}ret"


@dataclass(frozen=True)
class StackCapture:
    """How user stacks are captured: `method` dwarf or fp, `size` bytes of stack copied, and
    whether the kernel walks frame pointers itself (`kernel_walk`, tracefs + fp)."""

    method: str = "dwarf"
    size: int = MAX_SNAPSHOT
    kernel_walk: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ProbescopeError(
                f"unknown stack method {self.method!r}", hint="choose dwarf or fp"
            )
        if self.size < 8 or self.size % 8:
            raise ProbescopeError(
                f"stack copy size {self.size} must be a positive multiple of 8 bytes"
            )

    def fetchargs(self, room: int = MAX_PROBE_FIELDS) -> list[str]:
        """The hidden arguments, in the kernel's grammar, for a probe that has `room` bytes of
        fixed fields left."""
        if self.kernel_walk:
            return [f"{RETURN_ADDRESS}=$stack0:x64"]
        texts = [f"{HIDDEN_PREFIX}{name}=%{name}:x64" for name, _ in REGISTERS]
        room -= 8 * len(REGISTERS)
        words = min(self.size, room) // 8
        if words <= 0:
            raise ProbescopeError(
                "the probe's own arguments leave no room to copy its stack",
                hint=f"a probe event holds at most {MAX_PROBE_FIELDS} bytes of arguments",
            )
        offset = 0
        chunk = 0
        while words > 0:
            count = min(words, ARRAY_LIMIT)
            texts.append(f"{HIDDEN_PREFIX}stack{chunk}=+{offset}($stack):x64[{count}]")
            offset += count * 8
            words -= count
            chunk += 1
        return texts


def fixed_size(spec: ProbeSpec) -> int:
    """Bytes of fixed fields a probe's arguments take in its event record."""
    return sum((4 if a.type.is_string else a.type.size) * (a.type.count or 1) for a in spec.args)


def with_arguments(
    probe: ResolvedProbe, texts: list[str], *, arch: Arch | None = None
) -> ResolvedProbe:
    """`probe` with more fetch arguments (kernel grammar) appended to its spec."""
    spec = probe.spec
    if not isinstance(spec, ProbeSpec) or not texts:
        return probe
    arch = arch or host_arch()
    flags = ParseFlags(user=spec.kind.is_user, is_return=spec.kind.is_return)
    args: list[FetchArg] = list(spec.args)
    used = frozenset(a.name for a in args)
    for text in texts:
        name = text.split("=", 1)[0]
        if name in used:
            continue
        args.append(parse_fetcharg(text, len(args), flags=flags, arch=arch, used_names=used))
        used = used | {name}
    return replace(probe, spec=replace(spec, args=tuple(args)))


def with_stack_capture(
    probe: ResolvedProbe, capture: StackCapture, *, arch: Arch | None = None
) -> ResolvedProbe:
    spec = probe.spec
    if not isinstance(spec, ProbeSpec) or not spec.kind.is_user:
        return probe
    return with_arguments(probe, capture.fetchargs(MAX_PROBE_FIELDS - fixed_size(spec)), arch=arch)


SampleReader = Callable[[Event], StackSample | None]


def sample_reader(event_type: EventType, *, at_function_entry: bool) -> SampleReader | None:
    """A function reading the StackSample out of an Event of `event_type`, or None when the
    type carries no copied stack."""
    names = event_type.arg_names
    registers = []
    for name, number in REGISTERS:
        hidden = f"{HIDDEN_PREFIX}{name}"
        if hidden not in names:
            return None
        registers.append((number, names.index(hidden)))
    chunks = []
    chunk = 0
    while f"{HIDDEN_PREFIX}stack{chunk}" in names:
        chunks.append(names.index(f"{HIDDEN_PREFIX}stack{chunk}"))
        chunk += 1
    if not chunks:
        return None

    def read(event: Event) -> StackSample:
        args = event.args
        words: list[int] = []
        for index in chunks:
            words += args[index]
        stack = struct.pack(f"<{len(words)}Q", *words)
        return StackSample(
            {number: args[index] for number, index in registers}, stack, at_function_entry
        )

    return read


def return_address_reader(event_type: EventType) -> Callable[[Event], int] | None:
    """The `$stack0` copy of a kernel-walked probe, for the caller the walk misses."""
    names = event_type.arg_names
    if RETURN_ADDRESS not in names:
        return None
    index = names.index(RETURN_ADDRESS)

    def read(event: Event) -> int:
        value: int = event.args[index]
        return value

    return read
