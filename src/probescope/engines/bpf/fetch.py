"""The compiler from resolved fetch arguments (language/model.py) to BPF, with the kernel's
semantics for uprobes (kernel/trace/trace_uprobe.c `process_fetch_insn`, trace_probe_tmpl.h):

- stage 1 takes an unsigned long from the context: a `pt_regs` register, `$stack` (the stack
  pointer), `$stackN` (read from the user stack; 0 when unreadable), `$retval`, `\\IMM`, `@ADDR`
  (the address), `@+OFFSET` (the probed binary's load bias + OFFSET: the bias is the probed
  address minus the probe's file offset, as `translate_user_vaddr` computes it);
- each `+|-OFFS(...)` but the last loads a pointer with `bpf_probe_read_user`; if it faults the
  value is dropped: a number reads 0, a string is a fault;
- the last step stores: a register value directly, memory with `bpf_probe_read_user` into the
  record (zeroed when it faults), arrays element by element when the whole read faults,
  bitfields shifted `<< (64-w-o) >> (64-w)`, strings as source addresses for `strings.py`
  (a Go string as its pointer and its length).

Register conventions of every program built here: r6 the context (`pt_regs *`), r7 the record
(ring-buffer space or a per-CPU scratch value), r9 the value being computed; r1-r5 and r0 are
scratch across helper calls; fp-8 is the one-word stack slot for loads. Programs stay
verifier-friendly by construction: every memory access is at a constant offset of the record or
the stack, helpers get constant sizes, and nothing loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from probescope.engines.bpf.abi import Helper
from probescope.engines.bpf.insn import (
    Alu,
    Emitter,
    Jmp,
    Reg,
    alu64_imm,
    alu64_reg,
    ld_imm64,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.engines.bpf.record import OFF_IP, ArgSlot
from probescope.engines.bpf.regs import PtRegs
from probescope.errors import BpfError
from probescope.language.model import (
    ArgType,
    Comm,
    Dereference,
    Fetch,
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

CTX = Reg.R6
RECORD = Reg.R7
VALUE = Reg.R9
SLOT = -8  # fp-8: the load slot
_S32 = range(-(1 << 31), 1 << 31)
_GO_STRING_WORDS = (Register, StackEntry)


class Unsupported(BpfError):
    """A fetch argument this compiler does not express (the reason says why)."""


@dataclass(frozen=True)
class FetchProgram:
    """A fetch taken apart the kernel's way: the first stage, then the offsets to dereference
    (innermost first; the last one is where the final value or string is)."""

    first: Fetch
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, fetch: Fetch) -> FetchProgram:
        offsets: list[int] = []
        while isinstance(fetch, Dereference):
            offsets.append(fetch.offset)
            fetch = fetch.base
        offsets.reverse()
        if isinstance(fetch, (Memory, FileOffset)):
            offsets.insert(0, 0)  # @ADDR and @+OFFSET name memory: load from the address
        return cls(fetch, tuple(offsets))


class FetchCompiler:
    """Emits the code of fetch arguments into `emitter`.

    `is_return`: the program runs at a function's return; `probe_offset`: the probe's file
    offset (for `@+OFFSET`); the probed (or, for returns, function) address must already be in
    the record header at OFF_IP when a `@+OFFSET` fetch runs. `sleepable`: the program is
    loaded sleepable and reads user memory with `bpf_copy_from_user`, which faults pages in as
    the kernel's own uprobe fetches do (`bpf_probe_read_user` fails on a page not yet touched).
    """

    def __init__(
        self,
        emitter: Emitter,
        regs: PtRegs,
        *,
        is_return: bool,
        probe_offset: int | None = None,
        sleepable: bool = False,
    ) -> None:
        self.e = emitter
        self.regs = regs
        self.is_return = is_return
        self.probe_offset = probe_offset
        self.sleepable = sleepable
        self.read_user = Helper.COPY_FROM_USER if sleepable else Helper.PROBE_READ_USER

    # -- stage 1 ---------------------------------------------------------------------------

    def first_stage(self, fetch: Fetch, dst: Reg = VALUE) -> None:
        """The unsigned long the kernel's first fetch stage gives, into `dst`."""
        e = self.e
        if isinstance(fetch, Register):
            e.emit(ldx(8, dst, CTX, self.regs.offset(fetch.name)))
        elif isinstance(fetch, StackPointer):
            e.emit(ldx(8, dst, CTX, self.regs.offset(self.regs.stack_pointer)))
        elif isinstance(fetch, StackEntry):
            e.emit(ldx(8, Reg.R3, CTX, self.regs.offset(self.regs.stack_pointer)))
            self._add_constant(Reg.R3, 8 * fetch.index)
            self.read_user_word(Reg.R3, dst)  # an unreadable slot reads 0
        elif isinstance(fetch, ReturnValue):
            if not self.is_return:
                raise Unsupported("$retval is only valid on return probes")
            e.emit(ldx(8, dst, CTX, self.regs.offset(self.regs.return_value)))
        elif isinstance(fetch, Immediate):
            self.load_constant(dst, fetch.value)
        elif isinstance(fetch, Memory):
            self.load_constant(dst, fetch.address)
        elif isinstance(fetch, FileOffset):
            if self.probe_offset is None:
                raise Unsupported("@+OFFSET needs the probe's file offset")
            e.emit(ldx(8, dst, RECORD, OFF_IP))
            self._add_constant(dst, fetch.offset - self.probe_offset)
        else:
            raise Unsupported(f"{fetch} cannot be fetched by a uprobe program")

    def load_constant(self, dst: Reg, value: int) -> None:
        value &= (1 << 64) - 1
        if value < 1 << 31:
            self.e.emit(mov64_imm(dst, value))
        else:
            self.e.emit(ld_imm64(dst, value))

    def _add_constant(self, dst: Reg, value: int) -> None:
        if value == 0:
            return
        if value in _S32:
            self.e.emit(alu64_imm(Alu.ADD, dst, value))
        else:
            self.e.emit(ld_imm64(Reg.R1, value), alu64_reg(Alu.ADD, dst, Reg.R1))

    def read_user_word(self, address: Reg, dst: Reg) -> None:
        """dst = the u64 at user `address` (R3 expected), 0 if unreadable. Leaves r0 = the
        helper's result (0 on success)."""
        e = self.e
        if address != Reg.R3:
            e.emit(mov64_reg(Reg.R3, address))
        e.emit(mov64_reg(Reg.R1, Reg.FP), alu64_imm(Alu.ADD, Reg.R1, SLOT), mov64_imm(Reg.R2, 8))
        e.call(self.read_user)
        e.emit(ldx(8, dst, Reg.FP, SLOT))

    def chain(self, program: FetchProgram, fault: str, dst: Reg = VALUE) -> None:
        """Stage 1 and every dereference but the last; `dst` ends holding the address the
        last offset applies to. A faulting dereference jumps to `fault`."""
        self.first_stage(program.first, dst)
        for offset in program.offsets[:-1]:
            self.e.emit(mov64_reg(Reg.R3, dst))
            self._add_constant(Reg.R3, offset)
            self.read_user_word(Reg.R3, dst)
            self.e.jump(Jmp.JNE, Reg.R0, 0, fault)

    # -- numbers -------------------------------------------------------------------------------

    def load_value(self, fetch: Fetch, arg_type: ArgType, fault: str, dst: Reg = VALUE) -> None:
        """The value of a scalar numeric argument in `dst` as the kernel would store it
        (truncated to the type's size, bitfields extracted; not sign-extended). A faulting
        dereference jumps to `fault`. This is what in-kernel aggregation keys are built from."""
        if arg_type.is_string or arg_type.count:
            raise Unsupported(f"type {arg_type} is not a scalar number")
        if isinstance(fetch, (Comm, ImmediateString)):
            raise Unsupported(f"{fetch} needs a string type")
        program = FetchProgram.of(fetch)
        size = arg_type.size
        if program.offsets:
            self.chain(program, fault, dst)
            self.e.emit(mov64_reg(Reg.R3, dst))
            self._add_constant(Reg.R3, program.offsets[-1])
            self.e.emit(
                st_imm(8, Reg.FP, SLOT, 0),
                mov64_reg(Reg.R1, Reg.FP),
                alu64_imm(Alu.ADD, Reg.R1, SLOT),
                mov64_imm(Reg.R2, size),
            )
            self.e.call(self.read_user)
            self.e.emit(ldx(size, dst, Reg.FP, SLOT))
        else:
            self.first_stage(program.first, dst)
            if size < 8:
                self.e.emit(alu64_imm(Alu.LSH, dst, 64 - 8 * size))
                self.e.emit(alu64_imm(Alu.RSH, dst, 64 - 8 * size))
        self._bitfield(arg_type, dst)

    def _bitfield(self, arg_type: ArgType, dst: Reg) -> None:
        if arg_type.bitfield is None:
            return
        width, offset, _container = arg_type.bitfield
        left = 64 - width - offset
        right = 64 - width
        if left:
            self.e.emit(alu64_imm(Alu.LSH, dst, left))
        if right:
            self.e.emit(alu64_imm(Alu.RSH, dst, right))

    def store_number(self, slot: ArgSlot) -> None:
        """Fetch a numeric argument (scalar or array) into its place in the record."""
        arg = slot.arg
        arg_type = arg.type
        if isinstance(arg.fetch, (Comm, ImmediateString)):
            raise Unsupported(f"{arg.expression!r} needs a string type")
        e = self.e
        fault = e.fresh("fault")
        done = e.fresh("done")
        program = FetchProgram.of(arg.fetch)
        size = arg_type.size
        if arg_type.count:
            if not program.offsets:
                raise Unsupported(f"array type {arg_type} needs a memory fetch")
            self.chain(program, fault)
            self._add_constant(VALUE, program.offsets[-1])
            self._read_user_into_record(slot.offset, size * arg_type.count, VALUE)
            whole = e.fresh("whole")
            e.jump(Jmp.JEQ, Reg.R0, 0, whole)
            for index in range(arg_type.count):  # the kernel reads element by element
                e.emit(mov64_reg(Reg.R3, VALUE))
                self._add_constant(Reg.R3, index * size)
                self._read_user_into_record(slot.offset + index * size, size, Reg.R3)
            e.label(whole)
            if arg_type.bitfield is not None:  # applied to each element, as stored
                for index in range(arg_type.count):
                    at = slot.offset + index * size
                    e.emit(ldx(size, Reg.R1, RECORD, at))
                    self._bitfield(arg_type, Reg.R1)
                    e.emit(stx(size, RECORD, at, Reg.R1))
        elif program.offsets and arg_type.bitfield is None:
            self.chain(program, fault)
            self._add_constant(VALUE, program.offsets[-1])
            self._read_user_into_record(slot.offset, size, VALUE)
        else:
            self.load_value(arg.fetch, arg_type, fault)
            e.emit(stx(size, RECORD, slot.offset, VALUE))
        if e.referenced(fault):
            e.goto(done)
            e.label(fault)
            self.zero_record(slot.offset, slot.size)
        if e.referenced(done):
            e.label(done)

    def _read_user_into_record(self, offset: int, size: int, address: Reg) -> None:
        """bpf_probe_read_user(record + offset, size, address): zeroed when it faults."""
        e = self.e
        if address != Reg.R3:
            e.emit(mov64_reg(Reg.R3, address))
        e.emit(mov64_reg(Reg.R1, RECORD), alu64_imm(Alu.ADD, Reg.R1, offset))
        e.emit(mov64_imm(Reg.R2, size))
        e.call(self.read_user)

    def zero_record(self, offset: int, size: int) -> None:
        end = offset + size
        while offset < end:
            step = (
                8
                if end - offset >= 8
                else 4
                if end - offset >= 4
                else 2
                if end - offset >= 2
                else 1
            )
            self.e.emit(st_imm(step, RECORD, offset, 0))
            offset += step

    # -- strings: where each one comes from ----------------------------------------------------

    def string_sources(self, slot: ArgSlot, store: int) -> None:
        """Write the user address of each string of `slot` (N of them for `string[N]`) as u64s
        at record + `store`; 0 stands for a fault. `$comm` and `\\"TEXT"` are handled by the
        caller (see `StringSource`)."""
        arg = slot.arg
        e = self.e
        if isinstance(arg.fetch, GoString):  # the pointer, then the length (a Go int)
            self.first_stage(arg.fetch.pointer)
            e.emit(stx(8, RECORD, store, VALUE))
            self.first_stage(arg.fetch.length)
            e.emit(stx(8, RECORD, store + 8, VALUE))
            return
        fault = e.fresh("sfault")
        done = e.fresh("sdone")
        program = FetchProgram.of(arg.fetch)
        count = arg.type.count
        if count:
            # string[N]: N pointers one after another at the address, each then a string.
            offsets = program.offsets or (0,)
            self.chain(FetchProgram(program.first, offsets), fault)
            self._add_constant(VALUE, offsets[-1])
            self._read_user_into_record(store, 8 * count, VALUE)
            e.jump(Jmp.JEQ, Reg.R0, 0, done)
            for index in range(count):
                e.emit(mov64_reg(Reg.R3, VALUE))
                self._add_constant(Reg.R3, 8 * index)
                self._read_user_into_record(store + 8 * index, 8, Reg.R3)
        else:
            if program.offsets:
                self.chain(program, fault)
                self._add_constant(VALUE, program.offsets[-1])
            else:
                self.first_stage(program.first)
            e.emit(stx(8, RECORD, store, VALUE))
        if e.referenced(fault):
            e.goto(done)
            e.label(fault)
            self.zero_record(store, 8 * (count or 1))
        if e.referenced(done):
            e.label(done)


def check_expressible(fetch: Fetch, arg_type: ArgType, *, is_return: bool) -> str | None:
    """Why this compiler cannot fetch the argument (None when it can)."""
    if isinstance(fetch, GoString):
        if not arg_type.is_string or arg_type.count:
            return f"{fetch} needs the gostring type"
        words = (fetch.pointer, fetch.length)
        if not all(isinstance(word, _GO_STRING_WORDS) for word in words):
            return f"{fetch}: a Go string's words are registers or stack slots"
        return None
    first = FetchProgram.of(fetch).first
    if isinstance(first, ReturnValue) and not is_return:
        return "$retval is only valid on return probes"
    if not isinstance(
        first,
        (
            Register,
            StackPointer,
            StackEntry,
            ReturnValue,
            Immediate,
            Memory,
            FileOffset,
            Comm,
            ImmediateString,
        ),
    ):
        return f"{first} is not available to uprobes"
    if arg_type.base in ("symbol", "symstr"):
        return f"type {arg_type.base} names kernel symbols; uprobes cannot use it"
    if isinstance(first, (Comm, ImmediateString)) and not arg_type.is_string:
        return f"{first} needs a string type"
    if isinstance(fetch, Dereference) and isinstance(first, (Comm, ImmediateString)):
        return f"{first} cannot be dereferenced"
    return None
