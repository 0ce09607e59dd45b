"""Is a file offset a safe uprobe site? Instruction boundaries (capstone) and misplaced addresses.

A breakpoint written into the middle of an instruction corrupts it: the kernel only checks
alignment and the instruction *at* the offset, so a wrong `SYMBOL+OFF` crashes the traced
program. Like kprobes' `BAD_INSN_BNDRY`, the function is decoded from its first byte up to the
offset. Raw numbers are also checked for the classic mix-ups: a link-time virtual address of an
ET_EXEC (0x401126) or a runtime address (0x7f…) given where a file offset belongs.
"""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

from probescope.errors import SymbolError
from probescope.symbols.elfimage import EM_386, EM_AARCH64, EM_X86_64
from probescope.symbols.function import FunctionSymbol
from probescope.symbols.table import SymbolTable

DECODE_SLACK = 16  # bytes decoded past the offset, so the instruction holding it is complete


class Instruction(NamedTuple):
    """One decoded instruction: `address` is its link-time virtual address."""

    address: int
    size: int
    mnemonic: str
    op_str: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()


_DISASSEMBLERS: dict[int, Any] = {}


def disassembler(machine: int) -> Any | None:
    """A capstone decoder for e_machine `machine` (x86_64, i386, aarch64), or None."""
    if machine in _DISASSEMBLERS:
        return _DISASSEMBLERS[machine]
    import capstone  # type: ignore[import-untyped]

    modes = {
        EM_X86_64: (capstone.CS_ARCH_X86, capstone.CS_MODE_64),
        EM_386: (capstone.CS_ARCH_X86, capstone.CS_MODE_32),
        EM_AARCH64: (capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM),
    }
    decoder = capstone.Cs(*modes[machine]) if machine in modes else None
    _DISASSEMBLERS[machine] = decoder
    return decoder


def decode(code: bytes, vaddr: int, machine: int) -> list[Instruction]:
    """Decode `code` loaded at `vaddr` until its end or the first byte capstone cannot decode."""
    decoder = disassembler(machine)
    if decoder is None:
        raise SymbolError(f"cannot decode instructions for ELF machine {machine}")
    return [Instruction(*fields) for fields in decoder.disasm_lite(code, vaddr)]


def function_code(path: str, table: SymbolTable, function: FunctionSymbol, limit: int) -> bytes:
    """The bytes of `function` from its start, at most `limit` bytes and not past its segment."""
    segment = table.load_for_offset(function.offset)
    end = function.offset + limit
    if segment is not None:
        end = min(end, segment.offset + segment.filesz)
    with open(path, "rb") as stream:
        stream.seek(function.offset)
        return stream.read(max(0, end - function.offset))


_FRAME_SETUP = (b"\x55", b"\xf3\x0f\x1e\xfa")  # push %rbp; endbr64


def starts_frame_setup(path: str, offset: int) -> bool:
    """The x86-64 instruction at this file offset is `push %rbp` or `endbr64`: where the
    kernel's perf stack walk of a uprobe hit (`is_uprobe_at_func_entry`) takes the probe for
    a function's entry and adds the return address at [sp] itself. False when unreadable."""
    try:
        with open(path, "rb") as stream:
            stream.seek(offset)
            code = stream.read(4)
    except OSError:
        return False
    return any(code.startswith(prefix) for prefix in _FRAME_SETUP)


def check_probe_offset(
    path: str | os.PathLike[str],
    offset: int,
    function: FunctionSymbol | None = None,
    *,
    table: SymbolTable | None = None,
    pid: int | None = None,
) -> None:
    """Raise SymbolError unless file `offset` of `path` is an instruction boundary in code.

    Checks, in order: the offset lies in the file and in an executable PT_LOAD (else it is
    explained as a virtual or runtime address when it looks like one — with `pid`, runtime
    addresses are translated through that process's maps); it lies inside `function` (found
    with `function_at_offset` when not given); decoding `function` from its start reaches the
    offset exactly. Offsets outside every known function are accepted (nothing to decode from).
    Only x86 and aarch64 are decoded; other machines get the segment checks only.
    """
    path = os.fspath(path)
    table = table or SymbolTable.for_path(path)
    if offset < 0:
        raise SymbolError(f"negative file offset {offset}")
    segment = table.load_for_offset(offset)
    if offset >= table.identity.size or segment is None or not segment.executable:
        raise _misplaced(path, table, offset, pid)
    if function is None:
        function = table.function_at_offset(offset)
        if function is None:
            return
    end = _function_end(table, function)
    if not function.offset <= offset < max(end, function.offset + 1):
        relative = offset - function.offset
        raise SymbolError(
            f"offset {offset:#x} is outside {function.display_name} "
            f"(file offsets {function.offset:#x}-{end:#x}, "
            f"{function.display_name}{relative:+#x})",
            hint=f"{function.display_name} is {end - function.offset} bytes long",
        )
    if offset == function.offset:
        return
    if table.machine == EM_AARCH64:
        _check_fixed_width(path, table, function, offset, 4)
    elif table.machine in (EM_X86_64, EM_386):
        _check_decoded(path, table, function, offset)


def check_probe_site(
    path: str | os.PathLike[str], offset: int, function_offset: int | None = None
) -> None:
    """check_probe_offset for a probe built without a FunctionSymbol at hand (a kernel-grammar
    spec taken as given): the enclosing function is the one starting at `function_offset`
    when given, else the one `offset` falls in."""
    table = SymbolTable.for_path(path)
    function = None
    if function_offset is not None:
        function = table.function_at_offset(function_offset)
        if function is not None and function.offset != function_offset:
            function = None
    check_probe_offset(path, offset, function, table=table)


def _function_end(table: SymbolTable, function: FunctionSymbol) -> int:
    """End offset of `function`: its st_size, or up to the next function when it has none."""
    if function.size:
        return function.offset + function.size
    following = table.next_function_offset(function.offset)
    segment = table.load_for_offset(function.offset)
    segment_end = function.offset if segment is None else segment.offset + segment.filesz
    return segment_end if following is None else min(following, segment_end)


def _label(function: FunctionSymbol, offset: int) -> str:
    relative = offset - function.offset
    return f"{function.display_name}+{relative:#x}" if relative else function.display_name


def _check_fixed_width(
    path: str, table: SymbolTable, function: FunctionSymbol, offset: int, width: int
) -> None:
    misalignment = (offset - function.offset) % width
    if misalignment:
        before = offset - misalignment
        with open(path, "rb") as stream:
            stream.seek(before)
            word = stream.read(width)
        decoded = decode(word, function.vaddr + before - function.offset, table.machine)
        text = f" ({decoded[0].text})" if decoded else ""
        raise SymbolError(
            f"offset {offset:#x} ({_label(function, offset)}) is inside the instruction at "
            f"{before:#x}{text} of {function.display_name}: {table.machine_name} instructions "
            f"are {width} bytes",
            hint=f"nearest instruction boundaries: {before:#x} ({_label(function, before)}), "
            f"{before + width:#x} ({_label(function, before + width)})",
        )


def _check_decoded(path: str, table: SymbolTable, function: FunctionSymbol, offset: int) -> None:
    wanted = offset - function.offset
    limit = wanted + DECODE_SLACK
    code = function_code(path, table, function, limit)
    instructions = decode(code, function.vaddr, table.machine)
    previous: Instruction | None = None
    for instruction in instructions:
        start = function.offset + instruction.address - function.vaddr
        if start == offset:
            return
        if start < offset < start + instruction.size:
            after = start + instruction.size
            raise SymbolError(
                f"offset {offset:#x} ({_label(function, offset)}) is inside the instruction at "
                f"{start:#x} ({instruction.text}) of {function.display_name}",
                hint=f"nearest instruction boundaries: {start:#x} ({_label(function, start)}) "
                f"and {after:#x} ({_label(function, after)})",
            )
        if start > offset:
            break
        previous = instruction
    decoded_to = function.offset + sum(i.size for i in instructions)
    stuck = code[decoded_to - function.offset : decoded_to - function.offset + 8].hex(" ")
    last = "" if previous is None else f" after {previous.text!r}"
    raise SymbolError(
        f"cannot tell whether offset {offset:#x} ({_label(function, offset)}) is an "
        f"instruction boundary: decoding {function.display_name} stops at {decoded_to:#x}"
        f"{last} (bytes {stuck or 'none'})",
        hint="check the offset with objdump -d and probe a listed instruction address",
    )


def _misplaced(path: str, table: SymbolTable, offset: int, pid: int | None) -> SymbolError:
    """Why `offset` is not in code, guessing the address it probably is."""
    as_vaddr = table.vaddr_to_offset(offset, executable=True)
    if as_vaddr is not None and as_vaddr != offset:
        function = table.function_at_offset(as_vaddr)
        where = f" ({_label(function, as_vaddr)})" if function else ""
        return SymbolError(
            f"{offset:#x} is not a file offset of code in {path}; it is the virtual address "
            f"of file offset {as_vaddr:#x}{where} ({table.type_name} segments are linked at "
            f"other addresses than their file offsets)",
            hint=f"use file offset {as_vaddr:#x}{where}: {path}:{as_vaddr:#x}",
        )
    if offset >= table.identity.size:
        translated = _runtime_translation(path, table, offset, pid)
        if translated is not None:
            return translated
        return SymbolError(
            f"offset {offset:#x} is beyond the end of {path} ({table.identity.size} bytes)",
            hint="if it is an address from a running process, subtract the start of its "
            "mapping and add the mapping's file offset (see /proc/PID/maps, or pass the pid), "
            "or name the function: SYMBOL+OFFSET",
        )
    code = [s for s in table.loads if s.executable]
    ranges = ", ".join(f"{s.offset:#x}-{s.offset + s.filesz:#x}" for s in code) or "none"
    segment = table.load_for_offset(offset)
    where = (
        "outside every PT_LOAD segment"
        if segment is None
        else (
            f"in a non-executable segment ({_flags(segment.flags)}, file offsets "
            f"{segment.offset:#x}-{segment.offset + segment.filesz:#x})"
        )
    )
    return SymbolError(
        f"offset {offset:#x} of {path} is {where}: it is not code",
        hint=f"executable code is at file offsets {ranges}",
    )


def _flags(flags: int) -> str:
    return "".join(c if flags & bit else "" for c, bit in (("R", 4), ("W", 2), ("E", 1)))


def _runtime_translation(
    path: str, table: SymbolTable, address: int, pid: int | None
) -> SymbolError | None:
    if pid is None:
        return None
    from probescope.symbols.maps import file_offset_of_address, mappings_of

    found = file_offset_of_address(pid, address)
    if found is None:
        return None
    mapping, file_offset = found
    if mapping not in mappings_of(pid, table.identity, [mapping]):
        return SymbolError(
            f"{address:#x} is a runtime address in process {pid}, but it lies in "
            f"{mapping.path}, not in {path}",
            hint=f"probe {mapping.path} at file offset {file_offset:#x}",
        )
    function = table.function_at_offset(file_offset)
    where = f" ({_label(function, file_offset)})" if function else ""
    return SymbolError(
        f"{address:#x} is a runtime address in process {pid}, not a file offset",
        hint=f"use file offset {file_offset:#x}{where}: {path}:{file_offset:#x}",
    )


_RIP_RELATIVE = re.compile(r"\[rip ([+-]) (0x[0-9a-f]+|\d+)\]")


def code_references(instructions: list[Instruction], machine: int) -> list[int]:
    """Virtual addresses the code materialises as pointers (x86 `lea [rip+d]`, arm64 `adrp+add`).

    Used to list the implementations an IFUNC resolver can return.
    """
    found: list[int] = []
    if machine == EM_X86_64:
        for instruction in instructions:
            if instruction.mnemonic != "lea":
                continue
            match = _RIP_RELATIVE.search(instruction.op_str)
            if match:
                displacement = int(match.group(2), 0) * (-1 if match.group(1) == "-" else 1)
                found.append(instruction.address + instruction.size + displacement)
    elif machine == EM_AARCH64:
        pages: dict[str, int] = {}
        for instruction in instructions:
            operands = [o.strip() for o in instruction.op_str.split(",")]
            if instruction.mnemonic in ("adrp", "adr") and len(operands) == 2:
                value = int(operands[1].lstrip("#"), 0)
                if instruction.mnemonic == "adr":
                    found.append(value)
                else:
                    pages[operands[0]] = value
            elif (
                instruction.mnemonic == "add"
                and len(operands) == 3
                and operands[1] in pages
                and operands[2].startswith("#")
            ):
                found.append(pages[operands[1]] + int(operands[2][1:], 0))
    return found
