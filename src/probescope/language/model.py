"""Immutable values of the probe language: probe kinds, fetch expressions, argument types, specs.

Describe first, apply later: nothing here touches a file or the kernel. `str(spec)` is the exact
line the kernel prints back in `uprobe_events`/`kprobe_events`; `spec.definition()` is the line
probescope writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

UPROBE_DEFAULT_GROUP = "uprobes"
KPROBE_DEFAULT_GROUP = "kprobes"
EPROBE_DEFAULT_GROUP = "eprobes"


class ProbeKind(StrEnum):
    UPROBE = "uprobe"
    URETPROBE = "uretprobe"
    KPROBE = "kprobe"
    KRETPROBE = "kretprobe"
    EPROBE = "eprobe"
    TRACEPOINT = "tracepoint"
    FUNCTION = "function"
    USDT = "usdt"

    @property
    def is_return(self) -> bool:
        return self in (ProbeKind.URETPROBE, ProbeKind.KRETPROBE)

    @property
    def is_user(self) -> bool:
        return self in (ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.USDT)

    @property
    def is_kernel(self) -> bool:
        return self in (ProbeKind.KPROBE, ProbeKind.KRETPROBE)


# ---------------------------------------------------------------------------------------------
# Fetch expressions (FETCHARG): one class per form of the kernel's grammar.


@dataclass(frozen=True)
class Register:
    """`%REG`: a register of the probed context."""

    name: str

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class Memory:
    """`@ADDR`: memory at an absolute address."""

    address: int

    def __str__(self) -> str:
        return f"@0x{self.address:x}"


@dataclass(frozen=True)
class FileOffset:
    """`@+OFFSET`: memory at a file offset of the probed binary (uprobes only)."""

    offset: int

    def __str__(self) -> str:
        return f"@+0x{self.offset:x}" if self.offset >= 0 else f"@+-0x{-self.offset:x}"


@dataclass(frozen=True)
class KernelSymbol:
    """`@SYM[+|-offs]`: memory at a kernel data symbol (kprobes only)."""

    symbol: str
    offset: int = 0

    def __str__(self) -> str:
        if self.offset > 0:
            return f"@{self.symbol}+{self.offset}"
        if self.offset < 0:
            return f"@{self.symbol}{self.offset}"
        return f"@{self.symbol}"


@dataclass(frozen=True)
class StackEntry:
    """`$stackN`: the Nth unsigned long above the stack pointer."""

    index: int

    def __str__(self) -> str:
        return f"$stack{self.index}"


@dataclass(frozen=True)
class StackPointer:
    """`$stack`: the stack pointer itself."""

    def __str__(self) -> str:
        return "$stack"


@dataclass(frozen=True)
class ReturnValue:
    """`$retval`: the return value register (return probes only)."""

    def __str__(self) -> str:
        return "$retval"


@dataclass(frozen=True)
class Comm:
    """`$comm`: the current task's command name (string type only)."""

    spelling: str = "comm"

    def __str__(self) -> str:
        return f"${self.spelling}"


@dataclass(frozen=True)
class FunctionArg:
    """`$argN` (1-based): a function argument (kernel function entry only)."""

    index: int

    def __str__(self) -> str:
        return f"$arg{self.index}"


@dataclass(frozen=True)
class EventField:
    """`$FIELD`: a field of the attached event (eprobes only)."""

    name: str

    def __str__(self) -> str:
        return f"${self.name}"


@dataclass(frozen=True)
class Immediate:
    """`\\IMM`: an immediate value, stored as the kernel's unsigned long."""

    value: int

    def __str__(self) -> str:
        return f"\\{self.value}"


@dataclass(frozen=True)
class ImmediateString:
    """`\\"TEXT"`: an immediate string."""

    text: str

    def __str__(self) -> str:
        return f'\\"{self.text}"'


@dataclass(frozen=True)
class AbiArgument:
    """`argN` (friendly form, 1-based): the ABI's Nth integer argument.

    Only the friendly form has it; lowering turns it into a Register or a StackEntry (uprobes)
    or a FunctionArg (kprobes). `spelling` is the text as written (`arg1`, `$arg1`), `column`
    where it starts in the spec.
    """

    number: int
    spelling: str
    column: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return self.spelling


@dataclass(frozen=True)
class FriendlyReturnValue:
    """`retval` (friendly form): the return value, lowered to ReturnValue (`$retval`)."""

    spelling: str
    column: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return self.spelling


@dataclass(frozen=True)
class Dereference:
    """`+|-[u]OFFS(FETCHARG)`: load from the address FETCHARG + OFFS."""

    offset: int
    base: Fetch
    user: bool = False

    def __str__(self) -> str:
        sign = "-" if self.offset < 0 else "+"
        return f"{sign}{'u' if self.user else ''}{abs(self.offset)}({self.base})"


@dataclass(frozen=True)
class GoString:
    """A Go string passed as two words, `pointer` and `length` (friendly `argN:gostring` of a
    Go function, lowered): the bytes pointer[0:length]. The kernel's fetch grammar has no way
    to bound a read by a length, so only engines that read memory themselves take it."""

    pointer: Fetch
    length: Fetch

    def __str__(self) -> str:
        return f"gostring({self.pointer},{self.length})"


Fetch = (
    Register
    | Memory
    | FileOffset
    | KernelSymbol
    | StackEntry
    | StackPointer
    | ReturnValue
    | Comm
    | FunctionArg
    | EventField
    | Immediate
    | ImmediateString
    | Dereference
    | AbiArgument
    | FriendlyReturnValue
    | GoString
)
FriendlyVariable = AbiArgument | FriendlyReturnValue


def innermost(fetch: Fetch) -> Fetch:
    """The fetch at the bottom of a dereference chain."""
    while isinstance(fetch, Dereference):
        fetch = fetch.base
    return fetch


def dereference_depth(fetch: Fetch) -> int:
    depth = 0
    while isinstance(fetch, Dereference):
        depth += 1
        fetch = fetch.base
    return depth


# ---------------------------------------------------------------------------------------------
# Argument types


STRING_TYPES = frozenset({"string", "ustring", "symstr"})


@dataclass(frozen=True)
class ArgType:
    """A fetcharg type as the kernel's `probe_fetch_types[]` knows it.

    `name` is the spelling (`u32`, `x64`, `string`, `b3@4/32`); `base` the table entry it maps
    to (`u32` for that bitfield); `size` the bytes of one element in the record.
    """

    name: str
    base: str
    size: int
    signed: bool
    bitfield: tuple[int, int, int] | None = None  # (width, offset, container bits)
    count: int = 0  # array length; 0 = scalar

    @property
    def is_string(self) -> bool:
        return self.base in STRING_TYPES

    @property
    def is_hex(self) -> bool:
        return self.base.startswith("x")

    @property
    def record_size(self) -> int:
        return self.size * (self.count or 1)

    def __str__(self) -> str:
        return f"{self.name}[{self.count}]" if self.count else self.name


@dataclass(frozen=True)
class FetchArg:
    """`[NAME=]FETCHARG[:TYPE]`: one argument of a probe.

    `expression` is the text after `NAME=` exactly as given, which is what the kernel echoes back;
    `column` is where that text starts in the spec (None when the argument was not parsed from
    one).
    """

    name: str
    fetch: Fetch
    type: ArgType
    expression: str
    named: bool = True
    column: int | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.name}={self.expression}"


# ---------------------------------------------------------------------------------------------
# Probe locations and specs


@dataclass(frozen=True)
class UprobeLocation:
    """`PATH:OFFSET[(REF)]`: a file offset in a binary, with an optional USDT semaphore offset."""

    path: str
    offset: int
    ref_ctr_offset: int | None = None

    def __str__(self) -> str:
        text = f"{self.path}:0x{self.offset:016x}"
        if self.ref_ctr_offset is not None:
            text += f"(0x{self.ref_ctr_offset:x})"
        return text


@dataclass(frozen=True)
class KprobeLocation:
    """`[MOD:]SYM[+offs]` or `MEMADDR`: a kernel text location."""

    symbol: str | None = None
    offset: int = 0
    address: int | None = None
    module: str | None = None

    def __str__(self) -> str:
        if self.symbol is None:
            return f"0x{self.address or 0:x}"
        name = f"{self.module}:{self.symbol}" if self.module else self.symbol
        return f"{name}+{self.offset}" if self.offset else name


@dataclass(frozen=True)
class EprobeLocation:
    """`SYSTEM.EVENT` (or `SYSTEM/EVENT`): the trace event an event probe attaches to."""

    system: str
    event: str
    separator: str = "."

    def __str__(self) -> str:
        return f"{self.system}.{self.event}"


Location = UprobeLocation | KprobeLocation | EprobeLocation


@dataclass(frozen=True)
class ProbeSpec:
    """One dynamic-event definition in the kernel's grammar."""

    kind: ProbeKind
    location: Location
    group: str | None = None
    event: str | None = None
    args: tuple[FetchArg, ...] = ()
    maxactive: int | None = None
    filter: str | None = None
    source: str | None = field(default=None, compare=False)

    @property
    def group_name(self) -> str:
        if self.group:
            return self.group
        if self.kind.is_kernel:
            return KPROBE_DEFAULT_GROUP
        if self.kind is ProbeKind.EPROBE:
            return EPROBE_DEFAULT_GROUP
        return UPROBE_DEFAULT_GROUP

    @property
    def event_name(self) -> str:
        if self.event:
            return self.event
        return auto_event_name(self)

    @property
    def prefix(self) -> str:
        if self.kind is ProbeKind.EPROBE:
            return "e"
        if self.kind.is_return:
            return f"r{self.maxactive}" if self.maxactive else "r"
        return "p"

    def definition(self) -> str:
        """The line probescope writes to create this event (explicit group and event)."""
        return self._line()

    def __str__(self) -> str:
        return self._line()

    def _line(self) -> str:
        parts = [f"{self.prefix}:{self.group_name}/{self.event_name}", str(self.location)]
        parts.extend(str(a) for a in self.args)
        if self.filter and self.kind is ProbeKind.EPROBE:
            # Only event probes take a filter in their definition; the others' goes to the
            # event's `filter` file.
            parts.append(f"if {self.filter}")
        return " ".join(parts)

    def with_names(self, group: str | None, event: str | None) -> ProbeSpec:
        from dataclasses import replace

        return replace(self, group=group, event=event, source=None)


@dataclass(frozen=True)
class DeleteSpec:
    """`-:[GRP/][EVENT] [PLACE [ARGS]]`: removes an event, or one probe point of it."""

    group: str | None
    event: str | None
    words: tuple[str, ...] = ()
    source: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        head = f"-:{self.group}/{self.event or ''}" if self.group else f"-:{self.event}"
        return " ".join((head, *self.words))


def auto_event_name(spec: ProbeSpec) -> str:
    """The name the kernel gives an event defined without one."""
    loc = spec.location
    if isinstance(loc, UprobeLocation):
        base = loc.path.rsplit("/", 1)[-1]
        for i, ch in enumerate(base):
            if ch in ".-_":
                base = base[:i]
                break
        return f"p_{base}_0x{loc.offset:x}"[:63]
    if isinstance(loc, KprobeLocation):
        letter = "r" if spec.kind.is_return else "p"
        if loc.symbol is None:
            return f"{letter}_0x{loc.address or 0:x}"
        name = f"{loc.module}:{loc.symbol}" if loc.module else loc.symbol
        raw = f"{letter}_{name}_{loc.offset}"
        return "".join("_" if c in ":.*" else c for c in raw)[:63]
    return loc.event
