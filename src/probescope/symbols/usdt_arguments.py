"""SDT argument strings (`-4@%edi 8@-16(%rbp)`) parsed and translated into kernel fetchargs.

Each argument of a `.note.stapsdt` note is `[-]SIZE[f]@OPERAND`: the byte size, `-` for a
signed value, `f` for floating point, then an operand in the assembler syntax of the target
(AT&T on x86, `x4`/`[sp, 96]`/`5` on aarch64). sdt.h lets the compiler choose the operand
(constraint "nor"), so it may be any register alias, an immediate, or any memory form, and the
SIZE governs even when the register alias is narrower (sdt.h's note on gdb PR24541).

Translation targets a uprobe *at the probe site*: registers use the kernel's names (`%di`, not
`%rdi`), memory becomes `±DISP(%reg)`, immediates `\\N`, and symbol-relative operands
(`g_int(%rip)`, `8+g_pt(%rip)`) become `±D(%ip)` with D = symbol − probe address, both link-time:
the kernel reports the probe address in `%ip` when a uprobe hits, so this holds for any load
address. (`@+OFFSET` would say the same, but kernels before the 2026 fix "tracing/probes: Fix
double addition of offset for @+FOFFSET" read at twice the offset.) Forms the kernel grammar
cannot express — base+index*scale, floating-point registers, segment overrides, addresses of
symbols in position-independent files — are kept with a `problem` saying why.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from probescope.language.arch import ARM64, X86_64
from probescope.language.x86_64_registers import ASSEMBLER_NAMES, HIGH_BYTE_NAMES
from probescope.symbols.elfimage import EM_386, EM_AARCH64, EM_X86_64, MACHINE_NAMES

STRING_TYPES = frozenset({"string", "ustring"})

OperandKind = Literal["register", "immediate", "memory"]


@dataclass(frozen=True)
class SdtOperand:
    """One decoded operand, with kernel register names.

    register: `register` holds the value. immediate: the value is `displacement` (+ the address of
    `symbol`). memory: the value is at `register` + `index`*`scale` + `displacement` (+ the
    address of `symbol`); `register == "ip"` marks a PC-relative (`%rip`) operand, and
    `register is None and index is None` an absolute address.
    """

    kind: OperandKind
    register: str | None = None
    displacement: int = 0
    symbol: str | None = None
    index: str | None = None
    scale: int = 1


@dataclass(frozen=True)
class UsdtArg:
    """One argument of one USDT site, with its kernel fetcharg or the reason there is none.

    `fetcharg` is the expression with its type (`%di:s32`, `-1204(%bp):s32`, `\\5:s32`,
    `+11977(%ip):s32`), `problem` says why an argument cannot be fetched, `note` qualifies a
    fetch that works (floating point read as raw bits).
    """

    index: int
    text: str
    size: int
    signed: bool
    is_float: bool
    operand: SdtOperand | None
    fetcharg: str | None
    problem: str | None = None
    note: str | None = None

    @property
    def name(self) -> str:
        """The kernel's default name for it: `arg1`, `arg2`, ..."""
        return f"arg{self.index}"

    @property
    def type_name(self) -> str:
        """The fetch type SIZE and sign give: `s32`, `u64`; `x64` for floating-point bits."""
        return fetch_type(self.size, self.signed, self.is_float)

    @property
    def definition(self) -> str | None:
        """`argN=FETCHARG`, the text to put in a uprobe definition, or None."""
        return None if self.fetcharg is None else f"{self.name}={self.fetcharg}"

    def fetch_as(self, type_name: str) -> str | None:
        """The fetcharg read with another type; `string` reads the string the value points to.

        None when this argument has no fetch, or when a string is asked of a value that cannot
        be used as an address in a fetcharg.
        """
        if self.fetcharg is None:
            return None
        expression = self.fetcharg.rpartition(":")[0]
        if type_name not in STRING_TYPES:
            return f"{expression}:{type_name}"
        if expression.startswith("\\"):
            value = int(expression[1:], 0)
            return f"@{value:#x}:{type_name}" if value >= 0 else None
        return f"+0({expression}):{type_name}"


def fetch_type(size: int, signed: bool, is_float: bool = False) -> str:
    """The kernel fetch type of an SDT argument: signed → sN, unsigned → uN, float → xN."""
    bits = size * 8
    if is_float:
        return f"x{bits}"
    return f"{'s' if signed else 'u'}{bits}"


# ---- splitting the argument string -----------------------------------------------------------

_ARG_START = re.compile(r"(?<!\S)(-?)(\d+)(f?)@")


@dataclass(frozen=True)
class _RawArg:
    index: int
    text: str
    size: int
    signed: bool
    is_float: bool
    operand_text: str
    problem: str | None = None


def _split(arguments: str, long_size: int) -> list[_RawArg]:
    """The `[-]SIZE[f]@OPERAND` items of a note, in order (1-based index)."""
    text = arguments.strip()
    if not text:
        return []
    starts = list(_ARG_START.finditer(text))
    if not starts or starts[0].start() != 0:
        # sdt.h before 2010 wrote bare operands: GDB and SystemTap read them as `long`.
        return [
            _RawArg(i, word, long_size, True, False, word) for i, word in enumerate(text.split(), 1)
        ]
    found = []
    for number, match in enumerate(starts, 1):
        end = starts[number].start() if number < len(starts) else len(text)
        item = text[match.start() : end].strip()
        sign, size, floating = match.group(1), int(match.group(2)), match.group(3)
        operand = text[match.end() : end].strip()
        problem = None
        if size not in (1, 2, 4, 8):
            problem = (
                f"{_bytes(size)} value has no fetch type (the kernel's are 1, 2, 4 or 8 bytes)"
            )
        elif not operand:
            problem = "the operand is missing"
        found.append(_RawArg(number, item, size, sign == "-", floating == "f", operand, problem))
    return found


# ---- x86 (AT&T) operands --------------------------------------------------------------------


_X86_64_ONLY = frozenset(
    name
    for name, (kernel, width) in ASSEMBLER_NAMES.items()
    if kernel.startswith("r") or width == 8 or name in ("sil", "dil", "bpl", "spl")
)

_SYMBOL = r"[A-Za-z_.$][A-Za-z0-9_.$@]*"
_NUMBER = r"(?:0[xX][0-9a-fA-F]+|\d+)"
_TERM = re.compile(rf"\s*([+-]?)\s*({_NUMBER}|{_SYMBOL})\s*")
_X86_SEGMENT = re.compile(r"^%[c-gs]s\s*:")
_X86_MEMORY = re.compile(
    r"^(?P<disp>[^(]*)"
    r"\(\s*(?P<base>%[a-z0-9]+)?\s*(?:,\s*(?P<index>%[a-z0-9]+)?\s*(?:,\s*(?P<scale>\d+))?)?\s*\)$"
)


class _OperandError(Exception):
    """Internal: why an operand cannot be decoded or fetched (becomes UsdtArg.problem)."""


def _expression(text: str) -> tuple[int, str | None]:
    """`8+g_pt`, `g_pt+8`, `-16`, `0x10` → (constant, symbol or None)."""
    text = text.strip()
    if not text:
        return 0, None
    position, constant, symbol = 0, 0, None
    while position < len(text):
        match = _TERM.match(text, position)
        if match is None or match.end() == position:
            raise _OperandError(f"cannot read the expression {text!r}")
        if position and not match.group(1):
            raise _OperandError(f"cannot read the expression {text!r}")
        sign, term = match.group(1), match.group(2)
        if term[0].isdigit():
            value = int(term, 0)
            constant += -value if sign == "-" else value
        else:
            if symbol is not None or sign == "-":
                raise _OperandError(f"the expression {text!r} combines symbols")
            symbol = term
        position = match.end()
    return constant, symbol


def _x86_register(name: str, is_64bit: bool) -> tuple[str, int]:
    bare = name[1:] if name.startswith("%") else name
    if bare in HIGH_BYTE_NAMES:
        raise _OperandError(
            f"%{bare} is bits 8-15 of %{bare[0]}x, which a fetcharg cannot shift out"
        )
    if bare.startswith(("xmm", "ymm", "zmm", "st", "mm")):
        raise _OperandError(f"floating-point/vector register %{bare} cannot be fetched by a uprobe")
    found = ASSEMBLER_NAMES.get(bare)
    if found is None or (not is_64bit and bare in _X86_64_ONLY):
        raise _OperandError(f"unknown register %{bare}")
    return found


def _parse_x86(text: str, is_64bit: bool) -> tuple[SdtOperand, int]:
    """An AT&T operand → (operand, width of the register alias named, 0 if none)."""
    segment = _X86_SEGMENT.match(text)
    if segment:
        raise _OperandError(
            f"segment-relative address ({segment.group(0).strip()}) cannot be fetched by a uprobe"
        )
    if text.startswith("%"):
        kernel, width = _x86_register(text, is_64bit)
        if kernel == "ip":
            raise _OperandError("the instruction pointer is not a value of the program")
        return SdtOperand("register", register=kernel), width
    if text.startswith("$"):
        constant, symbol = _expression(text[1:])
        return SdtOperand("immediate", displacement=constant, symbol=symbol), 0
    match = _X86_MEMORY.match(text)
    if match is None:
        if "(" in text or "%" in text:
            raise _OperandError("not an operand form sdt.h emits")
        constant, symbol = _expression(text)
        return SdtOperand("memory", displacement=constant, symbol=symbol), 0
    constant, symbol = _expression(match.group("disp"))
    base = _x86_register(match.group("base"), is_64bit)[0] if match.group("base") else None
    index = _x86_register(match.group("index"), is_64bit)[0] if match.group("index") else None
    scale = int(match.group("scale") or 1)
    if scale not in (1, 2, 4, 8):
        raise _OperandError(f"scale {scale} is not 1, 2, 4 or 8")
    if base is None and index is None:
        raise _OperandError("a memory operand without registers inside ( )")
    operand = SdtOperand(
        "memory", register=base, displacement=constant, symbol=symbol, index=index, scale=scale
    )
    return operand, 0


# ---- aarch64 operands ------------------------------------------------------------------------

_ARM64_MEMORY = re.compile(r"^\[\s*(?P<base>[a-z0-9]+)\s*(?:,\s*(?P<rest>[^\]]*))?\]$")
_ARM64_CONSTANT = re.compile(rf"^#?\s*(-?{_NUMBER})$")


def _arm64_register(name: str) -> str:
    if name in ("sp", "wsp"):
        return "sp"
    if name == "lr":
        return "x30"
    match = re.fullmatch(r"[xw](\d+)", name)
    if match and int(match.group(1)) <= 30:
        return f"x{int(match.group(1))}"
    if re.fullmatch(r"[bhsdqv]\d+", name):
        raise _OperandError(f"floating-point/vector register {name} cannot be fetched by a uprobe")
    raise _OperandError(f"unknown register {name}")


def _parse_arm64(text: str) -> tuple[SdtOperand, int]:
    constant = _ARM64_CONSTANT.match(text)
    if constant:
        return SdtOperand("immediate", displacement=int(constant.group(1), 0)), 0
    if text in ("xzr", "wzr"):
        return SdtOperand("immediate", displacement=0), 0
    match = _ARM64_MEMORY.match(text)
    if match is None:
        if re.fullmatch(r"[a-z][a-z0-9]*", text):
            width = 4 if text.startswith("w") else 8
            return SdtOperand("register", register=_arm64_register(text)), width
        raise _OperandError("not an operand form sdt.h emits")
    base = _arm64_register(match.group("base"))
    rest = (match.group("rest") or "").strip()
    if not rest:
        return SdtOperand("memory", register=base), 0
    offset = _ARM64_CONSTANT.match(rest)
    if offset is None:
        raise _OperandError(f"register-offset addressing ({text}) has no fetcharg form")
    return SdtOperand("memory", register=base, displacement=int(offset.group(1), 0)), 0


# ---- translation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SiteContext:
    """What translating the operands of one site needs to know about the file and the site.

    `pc` is the link-time address of the probe; `position_independent` is true for ET_DYN
    files (loaded anywhere); `symbol_address(name)` gives a symbol's link-time address or None.
    """

    machine: int
    is_64bit: bool
    pc: int
    position_independent: bool
    symbol_address: Callable[[str], int | None]


def parse_arguments(arguments: str, context: SiteContext) -> tuple[UsdtArg, ...]:
    """Every argument of one note, each translated or with its problem."""
    long_size = 8 if context.is_64bit else 4
    return tuple(_translate(raw, context) for raw in _split(arguments, long_size))


def _translate(raw: _RawArg, context: SiteContext) -> UsdtArg:
    arg = UsdtArg(raw.index, raw.text, raw.size, raw.signed, raw.is_float, None, None)
    if raw.problem is not None:
        return replace(arg, problem=_problem(raw, raw.problem))
    try:
        operand, width = _decode(raw.operand_text, context)
        arg = replace(arg, operand=operand)
        if operand.kind == "register" and not context.is_64bit and raw.size > width >= 4:
            raise _OperandError(
                f"{_bytes(raw.size)} value named by the {width}-byte register "
                f"{raw.operand_text} spans a register pair"
            )
        expression = _fetch_expression(operand, context)
    except _OperandError as error:
        return replace(arg, problem=_problem(raw, str(error)))
    note = "floating-point value: fetched as its raw bits" if raw.is_float else None
    return replace(arg, fetcharg=f"{expression}:{arg.type_name}", note=note)


def _bytes(size: int) -> str:
    return f"{'an' if str(size)[0] == '8' or size in (11, 18) else 'a'} {size}-byte"


def _problem(raw: _RawArg, reason: str) -> str:
    return f"argument {raw.index} ({raw.text!r}): {reason}"


def _decode(text: str, context: SiteContext) -> tuple[SdtOperand, int]:
    if context.machine in (EM_X86_64, EM_386):
        return _parse_x86(text, context.is_64bit)
    if context.machine == EM_AARCH64:
        return _parse_arm64(text)
    name = MACHINE_NAMES.get(context.machine, f"machine {context.machine}")
    raise _OperandError(f"operands of {name} binaries are not supported")


def _kernel_registers(machine: int) -> tuple[frozenset[str], str]:
    arch = ARM64 if machine == EM_AARCH64 else X86_64
    return arch.registers, arch.instruction_pointer


def _fetch_expression(operand: SdtOperand, context: SiteContext) -> str:
    registers, ip = _kernel_registers(context.machine)
    if operand.register is not None and operand.register not in registers | {"ip"}:
        raise _OperandError(f"the kernel has no register named %{operand.register}")
    if operand.kind == "register":
        return f"%{operand.register}"
    if operand.kind == "immediate":
        if operand.symbol is None:
            return f"\\{operand.displacement}"
        if context.position_independent:
            raise _OperandError(
                f"the address of {operand.symbol} depends on where the file is loaded, "
                "and a fetcharg cannot add the load address to a constant"
            )
        return f"\\{_symbol(operand.symbol, context) + operand.displacement:#x}"
    if operand.index is not None:
        raise _OperandError("base+index*scale addressing has no fetcharg form")
    if operand.register == "ip" or (operand.register is None and operand.symbol is not None):
        if operand.symbol is None:
            raise _OperandError("a numeric %rip displacement has no meaning at a probe site")
        target = _symbol(operand.symbol, context) + operand.displacement
        return _dereference(target - context.pc, f"%{ip}")
    if operand.register is None:
        if context.position_independent:
            raise _OperandError(
                "an absolute address in a position-independent file has no fixed location"
            )
        return f"@{operand.displacement:#x}"
    displacement = operand.displacement
    if operand.symbol is not None:
        if context.position_independent:
            raise _OperandError(
                f"{operand.symbol}'s address depends on where the file is loaded, "
                "and a fetcharg cannot add it to a register"
            )
        displacement += _symbol(operand.symbol, context)
    return _dereference(displacement, f"%{operand.register}")


def _dereference(displacement: int, base: str) -> str:
    return f"{'-' if displacement < 0 else '+'}{abs(displacement)}({base})"


def _symbol(name: str, context: SiteContext) -> int:
    address = context.symbol_address(name)
    if address is None:
        raise _OperandError(
            f"symbol {name} is not in the file's symbol tables (stripped? install its debug file)"
        )
    return address
