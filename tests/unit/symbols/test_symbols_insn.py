"""Probe-site checks: instruction boundaries against objdump, misplaced addresses, aarch64."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from probescope.errors import SymbolError
from probescope.symbols.elfimage import EM_AARCH64, EM_X86_64
from probescope.symbols.insn import check_probe_offset, code_references, decode
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.parametrize(
    "pie, optimize, symbol",
    [
        (True, "-O0", "ps_add"),
        (True, "-O2", "main"),
        (False, "-O0", "main"),
        (False, "-O2", "ps_static_helper"),
    ],
)
def test_every_boundary_passes_and_every_other_byte_fails(
    pie: bool, optimize: str, symbol: str
) -> None:
    binary = programs.demo(pie=pie, optimize=optimize)
    table = SymbolTable.for_path(binary)
    function = table.lookup(symbol)
    boundaries = {
        function.offset + address - function.vaddr
        for address in programs.objdump_instructions(binary, symbol)
    }
    assert len(boundaries) > 2
    for offset in range(function.offset, function.end_offset):
        if offset in boundaries:
            check_probe_offset(binary, offset, function)
            check_probe_offset(binary, offset)  # function found by offset
        else:
            with pytest.raises(SymbolError, match="inside the instruction at") as error:
                check_probe_offset(binary, offset, function)
            assert "nearest instruction boundaries" in (error.value.hint or "")


def test_message_names_the_instruction_and_both_neighbours() -> None:
    binary = programs.demo(pie=True, optimize="-O0")
    table = SymbolTable.for_path(binary)
    function = table.lookup("ps_add")
    instructions = decode(
        binary.read_bytes()[function.offset : function.end_offset], function.vaddr, EM_X86_64
    )
    long_one = next(i for i in instructions if i.size > 1)
    start = function.offset + long_one.address - function.vaddr
    with pytest.raises(SymbolError) as error:
        check_probe_offset(binary, start + 1, function)
    assert f"inside the instruction at {start:#x} ({long_one.text})" in error.value.message
    assert f"ps_add+{start + 1 - function.offset:#x}" in error.value.message
    assert f"{start:#x}" in (error.value.hint or "")
    assert f"{start + long_one.size:#x}" in (error.value.hint or "")


def test_libc_malloc_boundaries() -> None:
    table = SymbolTable.for_path(LIBC)
    malloc = table.lookup("malloc")
    check_probe_offset(LIBC, malloc.offset)
    with pytest.raises(SymbolError, match="inside the instruction"):
        check_probe_offset(LIBC, malloc.offset + 1, malloc)


def test_offset_outside_the_given_function() -> None:
    binary = programs.demo()
    function = SymbolTable.for_path(binary).lookup("ps_add")
    with pytest.raises(SymbolError, match="outside ps_add"):
        check_probe_offset(binary, function.end_offset + 3, function)


def test_et_exec_virtual_address_is_explained_with_the_file_offset() -> None:
    binary = programs.demo(pie=False)
    function = SymbolTable.for_path(binary).lookup("ps_add")
    with pytest.raises(SymbolError, match="virtual address") as error:
        check_probe_offset(binary, function.vaddr)
    assert f"use file offset {function.offset:#x} (ps_add)" in (error.value.hint or "")


def test_python_virtual_address_is_explained() -> None:
    table = SymbolTable.for_path("/usr/bin/python3.11")
    function = table.lookup("Py_BytesMain")
    with pytest.raises(SymbolError, match="virtual address") as error:
        check_probe_offset("/usr/bin/python3.11", function.vaddr + 0)
    assert f"{function.offset:#x}" in (error.value.hint or "")


def test_offset_beyond_the_file() -> None:
    binary = programs.demo()
    with pytest.raises(SymbolError, match="beyond the end") as error:
        check_probe_offset(binary, 0x7F0000001234)
    assert "/proc/PID/maps" in (error.value.hint or "")


def test_runtime_address_is_translated_with_a_pid() -> None:
    table = SymbolTable.for_path(LIBC)
    malloc = table.lookup("malloc")
    address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    assert address is not None
    with pytest.raises(SymbolError, match="runtime address") as error:
        check_probe_offset(LIBC, address, pid=os.getpid())
    assert f"use file offset {malloc.offset:#x}" in (error.value.hint or "")


def test_offset_in_a_data_segment() -> None:
    binary = programs.demo()
    table = SymbolTable.for_path(binary)
    data = next(s for s in table.loads if not s.executable and s.offset > 0)
    with pytest.raises(SymbolError, match="non-executable segment") as error:
        check_probe_offset(binary, data.offset + 4)
    code = next(s for s in table.loads if s.executable)
    assert f"{code.offset:#x}" in (error.value.hint or "")


def test_offset_in_code_but_outside_known_functions_is_accepted() -> None:
    binary = programs.demo()
    table = SymbolTable.for_path(binary)
    code = next(s for s in table.loads if s.executable)
    unnamed = next(
        o for o in range(code.offset, code.offset + code.filesz) if not table.function_at_offset(o)
    )
    check_probe_offset(binary, unnamed)


def test_negative_offset() -> None:
    with pytest.raises(SymbolError, match="negative"):
        check_probe_offset(programs.demo(), -1)


def _arm64(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


ADRP_X0 = 0x90000000  # adrp x0, #page (immlo/immhi 0)
ADD_X0_X0_0x40 = 0x91010000  # add x0, x0, #0x40
ADR_X1_PLUS_8 = 0x10000041  # adr x1, #+8
RET = 0xD65F03C0


def test_aarch64_decoding_and_pointer_references() -> None:
    instructions = decode(_arm64(ADRP_X0, ADD_X0_X0_0x40, ADR_X1_PLUS_8, RET), 0x401000, EM_AARCH64)
    assert [i.mnemonic for i in instructions] == ["adrp", "add", "adr", "ret"]
    assert all(i.size == 4 for i in instructions)
    assert code_references(instructions, EM_AARCH64) == [0x401040, 0x401010]


def test_x86_rip_relative_lea_references() -> None:
    # lea rdx, [rip - 0x5d] ; lea rax, [rip + 0x10] ; ret
    code = bytes.fromhex("488d15a3ffffff488d0510000000c3")
    instructions = decode(code, 0x1156, EM_X86_64)
    assert code_references(instructions, EM_X86_64) == [0x1156 + 7 - 0x5D, 0x115D + 7 + 0x10]


def test_decode_stops_at_undecodable_bytes() -> None:
    instructions = decode(bytes.fromhex("900f0bffff"), 0x1000, EM_X86_64)
    assert [i.mnemonic for i in instructions] == ["nop", "ud2"]
