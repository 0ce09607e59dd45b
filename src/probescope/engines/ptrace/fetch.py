"""Fetchargs evaluated in user space with the kernel's semantics (kernel/trace/trace_probe*.c).

Each FetchArg is compiled once into the kernel's fetch program shape — a first stage (register,
stack, immediate, file offset, comm), dereferences, and a store (raw value, memory of the type's
size, or string), then bitfield and array stages — and turned into a Python closure. Per hit:

- an intermediate dereference that faults drops the value (the kernel returns before storing):
  numbers read 0, strings read as a fault (None);
- a faulting final memory read leaves the number 0 (the kernel ignores that error);
- `$stackN` that cannot be read is 0 (`get_user_stack_nth`);
- strings obey the kernel's two passes: each string's length is measured with strnlen up to
  MAX_STRING_SIZE (a longer one counts 0), the total is clamped so the record fits one page,
  then strings are copied in order, each truncated to what is left; nothing left → fault;
- a Go string (`GoString`: pointer and length) is exactly its `length` bytes, cut to
  MAX_STRING_SIZE with its NUL like any string; length 0 is "" without a read, a negative
  length or unreadable bytes a fault;
- immediate strings (`\\"text"`) read as a fault, as uprobes do on Linux 6.18 (the kernel copies
  them with strncpy_from_user from a kernel pointer).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace.memory import MAX_STRING_SIZE, TraceeMemory
from probescope.errors import PtraceError
from probescope.language.model import (
    ArgType,
    Comm,
    Dereference,
    Fetch,
    FetchArg,
    FileOffset,
    GoString,
    Immediate,
    ImmediateString,
    Memory,
    Register,
    ReturnValue,
    StackEntry,
    StackPointer,
)

PAGE_SIZE = 4096
_U64 = (1 << 64) - 1


@dataclass
class FetchContext:
    """What one hit offers to fetchargs: registers (ip already set to the probe address for
    entries, to the return address for returns), memory, the probe's load bias and comm."""

    regs: arch.Registers
    memory: TraceeMemory
    probe_base: int = 0  # probe runtime address - probe file offset
    comm: Callable[[], str] = field(default=lambda: "")


_COMM = object()
_FAULT = object()
_GO = object()
Value = Callable[[FetchContext], Any]


def _first_stage(fetch: Fetch, is_return: bool) -> Callable[[FetchContext], Any]:
    """The kernel's stage 1: an unsigned long from the context (or the comm token)."""
    if isinstance(fetch, Register):
        name = arch.register_field(fetch.name)
        return lambda ctx: getattr(ctx.regs, name)
    if isinstance(fetch, StackPointer):
        return lambda ctx: ctx.regs.rsp
    if isinstance(fetch, StackEntry):
        offset = fetch.index * arch.LONG_SIZE

        def stack_entry(ctx: FetchContext) -> int:
            value = ctx.memory.read_word((ctx.regs.rsp + offset) & _U64)
            return 0 if value is None else value

        return stack_entry
    if isinstance(fetch, ReturnValue):
        if not is_return:
            raise PtraceError("$retval is only valid on return probes")
        return lambda ctx: ctx.regs.rax
    if isinstance(fetch, Immediate):
        value = fetch.value & _U64
        return lambda ctx: value
    if isinstance(fetch, Memory):
        address = fetch.address & _U64
        return lambda ctx: address
    if isinstance(fetch, FileOffset):
        offset = fetch.offset
        return lambda ctx: (ctx.probe_base + offset) & _U64
    if isinstance(fetch, Comm):
        return lambda ctx: _COMM
    if isinstance(fetch, ImmediateString):
        return lambda ctx: _FAULT
    raise PtraceError(
        f"fetch argument {fetch} is not available to uprobes",
        hint="uprobes take %REG, @ADDR, @+OFFSET, $stackN, $stack, $retval, $comm, \\IMM, "
        '\\"TEXT" and +|-OFFS(...) dereferences',
    )


def _program(fetch: Fetch) -> tuple[Fetch, list[int]]:
    """(first stage fetch, dereference offsets from innermost to outermost)."""
    offsets: list[int] = []
    while isinstance(fetch, Dereference):
        offsets.append(fetch.offset)
        fetch = fetch.base
    offsets.reverse()
    if isinstance(fetch, (Memory, FileOffset)):
        offsets.insert(0, 0)  # @ADDR and @+OFFSET load from that address
    return fetch, offsets


# `char` values are one-character strings, as the tracefs engine decodes them and the kernel
# prints them ('%c'); bytes that are not UTF-8 follow Python's surrogateescape convention.
_CHARS = tuple(bytes([b]).decode("utf-8", "surrogateescape") for b in range(256))


def _convert(arg_type: ArgType) -> Callable[[int], Any]:
    bits = arg_type.size * 8
    mask = (1 << bits) - 1
    if arg_type.base == "char":
        return lambda v: _CHARS[v & 0xFF]
    if arg_type.bitfield is not None:
        width, offset, container = arg_type.bitfield
        cmask = (1 << container) - 1
        left = container - width - offset
        right = container - width
        return lambda v: ((v << left) & cmask) >> right
    if arg_type.signed:
        sign = 1 << (bits - 1)
        return lambda v: ((v & mask) ^ sign) - sign
    return lambda v: v & mask


def _unpacker(size: int) -> Callable[[bytes], int]:
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[size]
    unpack = struct.Struct(fmt).unpack_from
    return lambda data: int(unpack(data)[0])


class _StringSource:
    """Where one string of a hit comes from: an address, the comm, or a fault; a Go string
    (kind _GO) also has its length."""

    __slots__ = ("address", "kind", "length")

    def __init__(self, kind: object, address: int = 0, length: int = 0) -> None:
        self.kind = kind
        self.address = address
        self.length = length


@dataclass
class CompiledArg:
    name: str
    is_string: bool
    record_size: int
    numeric: Callable[[FetchContext], Any] | None = None
    strings: Callable[[FetchContext], list[_StringSource]] | None = None
    count: int = 0


def _compile_go_string(fetch: GoString, is_return: bool) -> Value:
    """A Go string: its pointer and its length (a signed Go int) from the first stage."""
    pointer = _first_stage(fetch.pointer, is_return)
    length = _first_stage(fetch.length, is_return)

    def sources(ctx: FetchContext) -> list[_StringSource]:
        size = int(length(ctx)) & _U64
        if size >> 63:
            return [_StringSource(_FAULT)]  # negative: not a string
        return [_StringSource(_GO, int(pointer(ctx)) & _U64, size)]

    return sources


def _read_go_string(memory: TraceeMemory, source: _StringSource) -> tuple[bytes, bool] | None:
    """Exactly pointer[0:length], cut to MAX_STRING_SIZE with its NUL; None on a fault."""
    size = min(source.length, MAX_STRING_SIZE - 1)
    if size == 0:
        return b"", True  # Go's empty string (its pointer may be nil): nothing to read
    data = memory.read_exact(source.address, size)
    return None if data is None else (data, True)


def compile_arg(arg: FetchArg, is_return: bool) -> CompiledArg:
    if isinstance(arg.fetch, GoString):
        return CompiledArg(arg.name, True, 4, strings=_compile_go_string(arg.fetch, is_return))
    fetch, offsets = _program(arg.fetch)
    arg_type = arg.type
    first = _first_stage(fetch, is_return)
    count = arg_type.count
    record_size = (4 if arg_type.is_string else arg_type.size) * (count or 1)

    if arg_type.is_string:
        return CompiledArg(
            arg.name, True, record_size, strings=_compile_string(first, offsets, count), count=count
        )

    if isinstance(fetch, (Comm, ImmediateString)):
        raise PtraceError(f"{arg.expression!r} needs a string type, not {arg_type.name}")
    convert = _convert(arg_type)
    if not offsets:
        if count:
            raise PtraceError(
                f"array type {arg_type} needs a memory fetch, not {arg.expression!r}",
                hint="use +0(...) or @ADDR for arrays",
            )
        return CompiledArg(
            arg.name, False, record_size, numeric=lambda ctx: convert(int(first(ctx)))
        )

    *chain, last = offsets
    size = arg_type.size
    unpack = _unpacker(size)
    faulted = convert(0)  # what a read that faults leaves: 0 (for char, NUL)

    def address_of(ctx: FetchContext) -> int | None:
        value = int(first(ctx))
        for off in chain:
            loaded = ctx.memory.read_word((value + off) & _U64)
            if loaded is None:
                return None
            value = loaded
        return (value + last) & _U64

    if count:

        def array(ctx: FetchContext) -> tuple[Any, ...]:
            address = address_of(ctx)
            if address is None:
                return (faulted,) * count
            data = ctx.memory.read(address, size * count)
            out = []
            for i in range(count):
                chunk = data[i * size : (i + 1) * size]
                out.append(convert(unpack(chunk)) if len(chunk) == size else faulted)
            return tuple(out)

        return CompiledArg(arg.name, False, record_size, numeric=array, count=count)

    def scalar(ctx: FetchContext) -> Any:
        address = address_of(ctx)
        if address is None:
            return faulted
        data = ctx.memory.read_exact(address, size)
        return faulted if data is None else convert(unpack(data))

    return CompiledArg(arg.name, False, record_size, numeric=scalar)


def _compile_string(
    first: Callable[[FetchContext], Any], offsets: list[int], count: int
) -> Callable[[FetchContext], list[_StringSource]]:
    if count:
        # string[N]: N char* read one after another, each then read as a string.
        *chain, last = offsets or [0]

        def sources(ctx: FetchContext) -> list[_StringSource]:
            value = first(ctx)
            if value is _FAULT or value is _COMM:
                return [_StringSource(_FAULT)] * count
            value = int(value)
            for off in chain:
                loaded = ctx.memory.read_word((value + off) & _U64)
                if loaded is None:
                    return [_StringSource(_FAULT)] * count
                value = loaded
            base = (value + last) & _U64
            out = []
            for i in range(count):
                pointer = ctx.memory.read_word((base + 8 * i) & _U64)
                out.append(
                    _StringSource(_FAULT) if pointer is None else _StringSource(None, pointer)
                )
            return out

        return sources

    if not offsets:

        def direct(ctx: FetchContext) -> list[_StringSource]:
            value = first(ctx)
            if value is _COMM:
                return [_StringSource(_COMM)]
            if value is _FAULT:
                return [_StringSource(_FAULT)]
            return [_StringSource(None, int(value))]

        return direct

    *chain, last = offsets

    def through_memory(ctx: FetchContext) -> list[_StringSource]:
        value = int(first(ctx))
        for off in chain:
            loaded = ctx.memory.read_word((value + off) & _U64)
            if loaded is None:
                return [_StringSource(_FAULT)]
            value = loaded
        return [_StringSource(None, (value + last) & _U64)]

    return through_memory


class ProbeFetcher:
    """All fetchargs of one probe, evaluated together (strings share one page per hit).

    `evaluate(ctx)` returns the values in spec order; it is the cheapest closure for the
    probe's args (numbers only: one generator over the compiled fetches)."""

    evaluate: Callable[[FetchContext], tuple[Any, ...]]

    def __init__(self, args: Sequence[FetchArg], is_return: bool) -> None:
        self.args = [compile_arg(arg, is_return) for arg in args]
        self.fixed_size = sum(a.record_size for a in self.args)
        self.has_strings = any(a.is_string for a in self.args)
        numeric = [a.numeric for a in self.args]
        if not self.has_strings:
            fns = [f for f in numeric if f is not None]
            self.evaluate = lambda ctx: tuple(f(ctx) for f in fns)
        else:
            self.evaluate = self._evaluate_with_strings

    def _evaluate_with_strings(self, ctx: FetchContext) -> tuple[Any, ...]:
        values: list[Any] = []
        pending: list[tuple[int, list[_StringSource], bool]] = []
        for arg in self.args:
            if arg.is_string:
                assert arg.strings is not None
                pending.append((len(values), arg.strings(ctx), bool(arg.count)))
                values.append(None)
            else:
                assert arg.numeric is not None
                values.append(arg.numeric(ctx))
        measured: list[list[tuple[bytes, bool] | None]] = []
        total = 0
        for _, sources, _ in pending:
            row: list[tuple[bytes, bool] | None] = []
            for source in sources:
                if source.kind is _COMM:
                    text = ctx.comm().encode("utf-8", "surrogateescape")[:15]
                    row.append((text, True))
                    total += len(text) + 1
                elif source.kind is _FAULT:
                    row.append(None)
                elif source.kind is _GO:
                    got = _read_go_string(ctx.memory, source)
                    row.append(got)
                    if got is not None:
                        total += len(got[0]) + 1
                else:
                    got = ctx.memory.read_string(source.address, MAX_STRING_SIZE)
                    row.append(got)
                    if got is not None and got[1] and len(got[0]) + 1 <= MAX_STRING_SIZE:
                        total += len(got[0]) + 1
            measured.append(row)
        remaining = min(total, PAGE_SIZE - self.fixed_size) if total else 0
        for (index, _, is_array), row in zip(pending, measured, strict=True):
            out: list[str | None] = []
            for got in row:
                if remaining <= 0 or got is None:
                    out.append(None)
                    continue
                data, terminated = got
                if len(data) + 1 <= remaining and terminated:
                    out.append(data.decode("utf-8", "surrogateescape"))
                    remaining -= len(data) + 1
                elif len(data) >= remaining:
                    out.append(data[: remaining - 1].decode("utf-8", "surrogateescape"))
                    remaining = 0
                else:
                    out.append(None)
            values[index] = tuple(out) if is_array else out[0]
        return tuple(values)
