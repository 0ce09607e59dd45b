"""FETCHARG parsing: `[NAME=]FETCHARG[:TYPE]` exactly as `traceprobe_parse_probe_arg` accepts it.

The kernel's order of checks, its integer parsers and its 16-slot fetch program are emulated so
that probescope accepts precisely what the running kernel accepts (tests diff against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import X86_64_REGISTER_ALIASES, Arch
from probescope.language.fetch_types import TYPE_NAMES, parse_bitfield, parse_type
from probescope.language.go_strings import GOSTRING, GOSTRING_TYPE, gostring_problem
from probescope.language.kernel_features import KernelGrammar
from probescope.language.kernel_numbers import (
    is_ascii_digit,
    is_good_name,
    kstrtol,
    kstrtouint,
    kstrtoul,
)
from probescope.language.model import (
    AbiArgument,
    ArgType,
    Comm,
    Dereference,
    EventField,
    Fetch,
    FetchArg,
    FileOffset,
    FriendlyReturnValue,
    FriendlyVariable,
    FunctionArg,
    Immediate,
    ImmediateString,
    KernelSymbol,
    Memory,
    Register,
    ReturnValue,
    StackEntry,
    StackPointer,
    innermost,
)

MAX_ARG_NAME_LEN = 32
MAX_ARGSTR_LEN = 63
MAX_ARRAY_LEN = 64
MAX_TRACE_ARGS = 128
FETCH_INSN_MAX = 16
PARAM_MAX_STACK = 2048  # THREAD_SIZE (16 KiB on x86_64/arm64) / sizeof(long)
RESERVED_FIELD_NAMES = frozenset(
    {
        "common_type",
        "common_flags",
        "common_preempt_count",
        "common_pid",
        "common_tgid",
        "__probe_ip",
        "__probe_ret_ip",
        "__probe_func",
    }
)


LATEST = KernelGrammar.latest()


@dataclass(frozen=True)
class ParseFlags:
    """The kernel's TPARG_FL_* for one probe: where the probe sits decides what args may do;
    `grammar` is what the target kernel's version accepts."""

    user: bool = True  # TPARG_FL_USER (uprobe) vs TPARG_FL_KERNEL
    is_return: bool = False  # TPARG_FL_RETURN
    function_entry: bool = False  # TPARG_FL_FENTRY (kprobe on a function's first byte)
    trace_event: bool = False  # TPARG_FL_TEVENT (eprobe)
    grammar: KernelGrammar = LATEST
    # probescope's friendly form: `argN` and `retval` name the ABI argument and the return
    # value (AbiArgument, FriendlyReturnValue), lowered once the probe's place is known.
    friendly: bool = False

    @property
    def kernel(self) -> bool:
        return not self.user

    @property
    def args_available(self) -> bool:
        """$argN: kernel function entry, or (newer kernels) a kernel function return."""
        on_return = self.is_return and self.grammar.args_on_return
        return self.kernel and (self.function_entry or on_return) and not self.trace_event


class _Slots:
    """The kernel's fixed fetch_insn array: index of the current instruction, bounded by END."""

    END = FETCH_INSN_MAX - 1

    def __init__(self) -> None:
        self.index = 0

    def advance(self) -> bool:
        """`++code == end`: False when the program is full."""
        self.index += 1
        return self.index != self.END


@dataclass
class _Context:
    spec: str
    column: int  # column in `spec` of the start of the current argument body
    flags: ParseFlags
    arch: Arch

    def error(self, message: str, offset: int = 0, hint: str | None = None) -> SpecError:
        return SpecError(message, spec=self.spec, column=self.column + offset, hint=hint)


def _register_hint(name: str, arch: Arch) -> str | None:
    if arch.name == "x86_64":
        kernel_name = X86_64_REGISTER_ALIASES.get(name)
        if kernel_name:
            return f"the kernel names x86_64 registers without a size prefix: write %{kernel_name}"
    if name.startswith("r") or name.startswith("e"):
        return None
    known = ", ".join(sorted(arch.registers))
    return f"{arch.name} registers: {known}"


class _FetchParser:
    """`parse_probe_arg`: one recursive descent over the fetch text, counting program slots."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        self.slots = _Slots()

    def parse(self, arg: str, offset: int) -> tuple[Fetch, str]:
        """Returns the fetch and its kernel op class (for the store checks of the caller)."""
        ctx = self.ctx
        flags = ctx.flags
        if flags.friendly:
            variable = friendly_variable(arg, ctx.column + offset, user=flags.user)
            if variable is not None:
                return self._parse_friendly(variable, offset)
        head = arg[:1]
        if head == "$":
            return self._parse_var(arg, offset)
        if head == "%":
            if flags.trace_event:
                raise ctx.error(
                    f"registers are not available in event probes: {arg!r}",
                    offset,
                    hint="event probes fetch the attached event's fields as $FIELD",
                )
            name = arg[1:]
            if name not in ctx.arch.registers:
                raise ctx.error(
                    f"invalid register name {arg!r}", offset, hint=_register_hint(name, ctx.arch)
                )
            return Register(name), "reg"
        if head == "@":
            return self._parse_memory(arg, offset)
        if head in ("+", "-"):
            return self._parse_deref(arg, offset)
        if head == "\\":
            if arg[1:2] == '"':
                body = arg[2:]
                if body[-1:] != '"':
                    raise ctx.error(
                        f"immediate string is not closed with '\"': {arg!r}",
                        offset + 2 + len(body),
                        hint='write \\"text" with the closing quote at the end of the argument',
                    )
                return ImmediateString(body[:-1]), "data"
            value = _immediate(arg[1:])
            if value is None:
                raise ctx.error(
                    f"invalid immediate value {arg!r}",
                    offset + 1,
                    hint="immediates are \\123, \\0x7b, \\-5 (decimal, 0x hex, leading 0 octal)",
                )
            return Immediate(value), "imm"
        if head and (head == "_" or (head.isascii() and head.isalpha())):
            if not (flags.kernel and (flags.function_entry or flags.is_return)):
                hint = None
                if flags.user:
                    hint = "uprobes cannot name variables; fetch registers (%di) or memory"
                if flags.friendly:
                    hint = "the friendly form names argN (the ABI's Nth argument) and retval"
                raise ctx.error(
                    f"{arg!r}: BTF variables are not available on this probe", offset, hint=hint
                )
            raise ctx.error(
                f"{arg!r}: BTF argument names need the kernel's BTF and are not supported "
                "by probescope",
                offset,
                hint="use $argN for function arguments",
            )
        hint = _FETCHARG_HINT + (", or argN and retval" if flags.friendly else "")
        raise ctx.error(f"invalid fetch argument {arg!r}", offset, hint=hint)

    def _parse_friendly(self, variable: FriendlyVariable, offset: int) -> tuple[Fetch, str]:
        """`argN`/`retval`: checked here against what the probe is; lowered later."""
        ctx = self.ctx
        flags = ctx.flags
        if isinstance(variable, FriendlyReturnValue):
            if not flags.is_return:
                raise ctx.error(
                    "retval is only available in a return probe",
                    offset,
                    hint="write r:TARGET:SYMBOL or TARGET:SYMBOL%return"
                    if flags.user
                    else "write kr:SYMBOL",
                )
            return variable, "retval"
        number = variable.number
        if number == 0:
            raise ctx.error("arguments count from arg1", offset)
        if flags.user:
            if flags.is_return:
                raise ctx.error(
                    f"arg{number} is not available in a return probe: uprobes cannot carry "
                    "entry arguments to the return",
                    offset,
                    hint="add an entry probe on the same function for its arguments",
                )
            return variable, "reg"
        if number > PARAM_MAX_STACK:
            raise ctx.error(
                f"invalid argument number in {variable.spelling!r}",
                offset,
                hint=f"the kernel reads at most {PARAM_MAX_STACK} arguments",
            )
        if not flags.args_available:
            raise ctx.error(
                f"{variable.spelling} can be used only on function entry or exit",
                offset,
                hint="probe the function itself (no +OFFSET)",
            )
        return variable, "arg"

    def _parse_var(self, arg: str, offset: int) -> tuple[Fetch, str]:
        ctx = self.ctx
        flags = ctx.flags
        name = arg[1:]
        if flags.trace_event:
            if name in ("comm", "COMM"):
                return Comm(name), "comm"
            if not is_good_name(name):
                raise ctx.error(f"invalid event field {arg!r}", offset)
            return EventField(name), "tp_arg"
        if name == "retval" or (flags.grammar.retval_prefix and name.startswith("retval")):
            if not flags.is_return:
                raise ctx.error(
                    "$retval is not available on an entry probe",
                    offset,
                    hint="use a return probe (r:... or %return) to read $retval",
                )
            return ReturnValue(), "retval"
        if name.startswith("stack"):
            rest = name[5:]
            if rest == "":
                return StackPointer(), "stackp"
            if is_ascii_digit(rest[:1]):
                index = kstrtoul(rest, 10)
                if index is None:
                    raise ctx.error(f"invalid $-variable {arg!r}", offset)
                if flags.kernel and index > PARAM_MAX_STACK:
                    raise ctx.error(f"invalid stack number in {arg!r}", offset)
                return StackEntry(index), "stack"
            raise ctx.error(f"invalid $-variable {arg!r}", offset, hint=_VARS_HINT)
        if name in ("comm", "COMM"):
            return Comm(name), "comm"
        if name.startswith("arg"):
            number = kstrtoul(name[3:], 10)
            if number is None:
                raise ctx.error(f"invalid $-variable {arg!r}", offset, hint=_VARS_HINT)
            if number == 0 or number > PARAM_MAX_STACK:
                raise ctx.error(
                    f"invalid argument number in {arg!r}", offset, hint="$argN counts from $arg1"
                )
            if not flags.args_available:
                hint = None
                if flags.user:
                    regs = " ".join(f"%{r}" for r in ctx.arch.arg_registers)
                    hint = (
                        f"uprobes have no $argN: read the ABI registers ({regs}), "
                        f"or use the friendly form arg{number}"
                    )
                raise ctx.error(
                    "$arg* can be used only on function entry or exit", offset, hint=hint
                )
            return FunctionArg(number), "arg"
        raise ctx.error(f"invalid $-variable {arg!r}", offset, hint=_VARS_HINT)

    def _parse_memory(self, arg: str, offset: int) -> tuple[Fetch, str]:
        ctx = self.ctx
        fetch: Fetch
        if is_ascii_digit(arg[1:2]):
            address = kstrtoul(arg[1:])
            if address is None:
                raise ctx.error(f"invalid memory address {arg!r}", offset)
            fetch = Memory(address)
        elif arg[1:2] == "+":
            if ctx.flags.kernel:
                raise ctx.error(f"file offsets are not available with kprobes: {arg!r}", offset)
            file_offset = kstrtol(arg[2:])
            if file_offset is None:
                raise ctx.error(f"invalid file offset value {arg!r}", offset)
            fetch = FileOffset(file_offset)
        else:
            if ctx.flags.user:
                raise ctx.error(
                    f"symbols are not available with uprobes: {arg!r}",
                    offset,
                    hint="uprobes take @ADDR (absolute) or @+OFFSET (offset in the probed file)",
                )
            symbol = arg[1:]
            split = next((i for i, c in enumerate(symbol) if c in "+-"), -1)
            sym_offset = 0
            if split >= 0:
                parsed = kstrtol(symbol[split:])
                if parsed is None:
                    raise ctx.error(f"invalid symbol offset in {arg!r}", offset + 1 + split)
                sym_offset, symbol = parsed, symbol[:split]
            fetch = KernelSymbol(symbol, sym_offset)
            if not self.slots.advance():
                raise ctx.error("dereference is too much nested", offset)
        if not self.slots.advance():
            raise ctx.error("dereference is too much nested", offset)
        return fetch, "deref"

    def _parse_deref(self, arg: str, offset: int) -> tuple[Fetch, str]:
        ctx = self.ctx
        user = arg[1:2] == "u"
        text = arg[0] + arg[2:] if user else arg
        if text[:1] == "+":
            text = text[1:]
        paren = text.find("(")
        if paren < 0:
            raise ctx.error(
                f"dereference needs a brace: {arg!r}", offset, hint="write +OFFSET(FETCHARG)"
            )
        deref_offset = kstrtol(text[:paren])
        if deref_offset is None:
            raise ctx.error(f"invalid dereference offset in {arg!r}", offset)
        inner_offset = offset + arg.find("(") + 1  # counted in `arg`: `text` lost a "u" and "+"
        inner = text[paren + 1 :]
        close = inner.rfind(")")
        if close < 0:
            raise ctx.error(
                f"dereference is not closed: {arg!r}",
                inner_offset + len(inner),
                hint="add the closing ')'",
            )
        base, op = self.parse(inner[:close], inner_offset)
        if op in ("comm", "data"):
            raise ctx.error("$comm and immediate strings can not be dereferenced", inner_offset)
        if not self.slots.advance():
            raise ctx.error(
                "dereference is too much nested",
                inner_offset,
                hint=f"the kernel allows at most {FETCH_INSN_MAX - 4} nested dereferences",
            )
        return Dereference(deref_offset, base, user), "uderef" if user else "deref"


_FETCHARG_HINT = (
    "a fetcharg is %REG, @ADDR, @+OFFSET, $stackN, $stack, $retval, $comm, "
    '+|-OFFS(FETCHARG), \\IMM or \\"STRING"'
)
_VARS_HINT = "$-variables are $stack, $stackN, $retval, $comm and (kernel probes) $argN"


def friendly_variable(text: str, column: int, *, user: bool) -> FriendlyVariable | None:
    """`argN` or `retval` (on uprobes also `$argN`/`$retval`, which the kernel has no use for
    there) as the whole of `text`, which starts at `column` of the spec; else None."""
    body = text[1:] if user and text[:1] == "$" else text
    if body == "retval":
        return FriendlyReturnValue(text, column)
    digits = body[3:]
    if body[:3] == "arg" and digits.isascii() and digits.isdigit():
        return AbiArgument(int(digits), text, column)
    return None


def _immediate(text: str) -> int | None:
    """`str_to_immediate`, as the unsigned long the kernel stores."""
    head = text[:1]
    if is_ascii_digit(head):
        return kstrtoul(text)
    if head == "-":
        value = kstrtol(text)
    elif head == "+":
        value = kstrtol(text[1:])
    else:
        return None
    return None if value is None else value & ((1 << 64) - 1)


def parse_fetcharg(
    text: str,
    index: int,
    *,
    flags: ParseFlags,
    arch: Arch,
    spec: str | None = None,
    column: int = 0,
    used_names: frozenset[str] = frozenset(),
) -> FetchArg:
    """Parse one `[NAME=]FETCHARG[:TYPE]` (0-based `index` among the probe's args).

    `spec`/`column` place the argument inside the whole definition for error carets.
    """
    ctx = _Context(spec if spec is not None else text, column, flags, arch)
    equals = text.find("=")
    named = equals >= 0
    if named:
        if equals > MAX_ARG_NAME_LEN:
            raise ctx.error(
                f"argument name {text[:equals]!r} is too long",
                hint=f"names have at most {MAX_ARG_NAME_LEN} characters",
            )
        if equals == 0:
            raise ctx.error("argument name is not specified before '='")
        name = text[:equals]
        body = text[equals + 1 :]
    else:
        name = f"arg{index + 1}"
        body = text
        if flags.friendly:
            # A bare `arg2`/`retval` names the argument after itself when that name is free.
            bare = friendly_variable(body.split(":", 1)[0], 0, user=flags.user)
            if bare is not None and bare.spelling.removeprefix("$") not in used_names:
                name, named = bare.spelling.removeprefix("$"), True
    if not is_good_name(name):
        raise ctx.error(
            f"argument name {name!r} must follow the rules of C identifiers",
            hint="use letters, digits and '_', not starting with a digit",
        )
    if name in RESERVED_FIELD_NAMES or name in used_names:
        hint = "give the argument a distinct NAME=" if not named else None
        raise ctx.error(f"argument name {name!r} is already used", hint=hint)
    ctx.column = column + equals + 1  # where the body starts (equals is -1 without a name)
    # What the kernel gets of a friendly argument is its lowered text: measured by lowering.
    if len(body) > MAX_ARGSTR_LEN and not flags.friendly:
        raise _too_long(ctx, body)
    if not body:
        raise ctx.error("no argument expression after '='")

    fetch_text, type_text, count = _split_type(body, ctx)
    type_offset = len(fetch_text) + 1 if type_text is not None else 0
    is_string_source = not flags.trace_event and (
        fetch_text in ("$comm", "$COMM") or fetch_text.startswith('\\"')
    )
    base: tuple[str, int, bool] | None
    if type_text == GOSTRING:
        base = (GOSTRING_TYPE.base, GOSTRING_TYPE.size, GOSTRING_TYPE.signed)
    elif is_string_source:
        if count or (type_text is not None and type_text != "string"):
            raise ctx.error(
                "$comm and immediate strings only accept the string type",
                type_offset,
                hint=f"write {fetch_text}:string or leave the type out",
            )
        base = parse_type("string", flags.grammar, user=flags.user)
    else:
        base = parse_type(type_text, flags.grammar, user=flags.user)
    if base is None:
        hint = "types: u8..u64, s8..s64, x8..x64, char, string, ustring, b<w>@<o>/<c>, TYPE[N]"
        if flags.user and type_text in ("symbol", "symstr"):
            hint = "symbol and symstr resolve kernel addresses; they are for kprobes only"
        elif type_text in TYPE_NAMES:
            release = ".".join(map(str, flags.grammar.release))
            hint = f"kernel {release} does not know the type {type_text!r}"
        raise ctx.error(f"unknown type {type_text!r}", type_offset, hint=hint)
    base_name, size, signed = base

    parser = _FetchParser(ctx)
    fetch, op = parser.parse(fetch_text, 0)
    lowered_later = isinstance(innermost(fetch), AbiArgument | FriendlyReturnValue)
    if flags.friendly and len(body) > MAX_ARGSTR_LEN and not lowered_later:
        raise _too_long(ctx, body)
    if type_text == GOSTRING:
        problem = gostring_problem(
            fetch, fetch_text, friendly=flags.friendly, user=flags.user, count=count
        )
        if problem is not None:
            raise ctx.error(problem[0], type_offset, hint=problem[1])
        return FetchArg(name, fetch, GOSTRING_TYPE, body, named=named, column=ctx.column)
    slots = parser.slots
    is_string = base_name in ("string", "ustring", "symstr")
    bitfield = None
    if is_string:
        if base_name == "symstr":
            if op not in ("reg", "stack", "retval", "arg", "deref", "tp_arg"):
                raise ctx.error("symstr doesn't accept data or user data", type_offset)
        elif op not in ("deref", "uderef", "imm", "comm", "data", "tp_arg"):
            raise ctx.error(
                f"string accepts only memory arguments: {fetch_text!r} is not one",
                type_offset,
                hint=f"dereference it: +0({fetch_text}):{type_text}",
            )
        if (
            base_name == "symstr" or op in ("imm", "comm", "data", "tp_arg") or count
        ) and not slots.advance():
            raise ctx.error("dereference is too much nested")
        store = "symstr" if base_name == "symstr" else "string"
    elif op in ("deref", "uderef"):
        store = "mem" if op == "deref" else "umem"  # FETCH_OP_ST_MEM / FETCH_OP_ST_UMEM
    else:
        if not slots.advance():
            raise ctx.error("dereference is too much nested")
        store = "raw"
    if type_text is not None and type_text.startswith("b"):
        bitfield = parse_bitfield(type_text, size)
        if bitfield is None or not slots.advance():
            raise ctx.error(
                f"invalid bitfield {type_text!r}",
                type_offset,
                hint="write b<width>@<bit offset>/<container size 8|16|32|64>, width+offset "
                "within the container",
            )
    if count:
        if store == "umem":
            raise ctx.error(
                "arrays are not read through a user-space dereference (+uOFFS)",
                type_offset,
                hint="the kernel reads arrays with ST_MEM only: write +OFFS(...) (uprobes read "
                "user memory with it too)",
            )
        if store not in ("mem", "string"):
            raise ctx.error(
                "arrays need a memory fetch",
                type_offset,
                hint=f"dereference it: +0({fetch_text}):{type_text}[{count}]",
            )
        if not slots.advance():
            raise ctx.error("dereference is too much nested")

    arg_type = ArgType(
        name=type_text if type_text is not None else "x64",
        base=base_name,
        size=size,
        signed=signed,
        bitfield=bitfield,
        count=count,
    )
    return FetchArg(
        name=name,
        fetch=fetch,
        type=arg_type,
        expression=body,
        named=named,
        column=ctx.column,
    )


def _too_long(ctx: _Context, body: str) -> SpecError:
    return ctx.error(f"argument expression is too long ({len(body)} > {MAX_ARGSTR_LEN} characters)")


def parse_fetchargs(
    text: str, words: list[tuple[int, str]], *, flags: ParseFlags, arch: Arch
) -> tuple[tuple[FetchArg, ...], list[SpecError]]:
    """Every `[NAME=]FETCHARG[:TYPE]` of one probe (`words` with their columns in `text`): the
    arguments that parsed, and the problems of the others (collect, then fail)."""
    args: list[FetchArg] = []
    errors: list[SpecError] = []
    used: set[str] = set()
    for index, (column, word) in enumerate(words):
        try:
            arg = parse_fetcharg(
                word,
                index,
                flags=flags,
                arch=arch,
                spec=text,
                column=column,
                used_names=frozenset(used),
            )
        except SpecErrors as many:
            errors += many.errors
        except SpecError as error:
            errors.append(error)
        else:
            used.add(arg.name)
            args.append(arg)
            continue
        equals = word.find("=")
        used.add(word[:equals] if equals > 0 else f"arg{index + 1}")
    return tuple(args), errors


def _split_type(body: str, ctx: _Context) -> tuple[str, str | None, int]:
    """`parse_probe_arg_type`: split `FETCH:TYPE[N]` at the first ':' and parse the array."""
    colon = body.find(":")
    if colon < 0:
        return body, None, 0
    fetch_text = body[:colon]
    type_text = body[colon + 1 :]
    count = 0
    bracket = type_text.find("[")
    if bracket >= 0:
        inside = type_text[bracket + 1 :]
        close = inside.find("]")
        base = colon + 1 + bracket + 1
        if close < 0:
            raise ctx.error(f"array is not closed in {body!r}", base + len(inside))
        if inside[close + 1 :]:
            raise ctx.error(f"array has a wrong suffix in {body!r}", base + close + 1)
        number = kstrtouint(inside[:close])
        if not number:
            raise ctx.error(f"invalid array size in {body!r}", base)
        if number > MAX_ARRAY_LEN:
            raise ctx.error(
                f"array size {number} is too big", base, hint=f"at most {MAX_ARRAY_LEN} elements"
            )
        count = number
        type_text = type_text[:bracket]
    return fetch_text, type_text, count
