"""ELF files gcc here cannot produce: aarch64 (boundary checks, adrp+add) and 32-bit big-endian.

The files come from symbol_programs.tiny_elf and are checked with readelf before use.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from probescope.errors import SymbolError
from probescope.symbols.elfimage import EM_AARCH64, ElfImage
from probescope.symbols.ifunc import ifunc_implementations
from probescope.symbols.insn import check_probe_offset
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs

EM_PPC = 20
NOP, ADRP_X0, ADD_X0_0x10, RET = 0xD503201F, 0x90000000, 0x91004000, 0xD65F03C0
STT_FUNC, STT_GNU_IFUNC = 2, 10


def _readelf_symbols(path: Path) -> dict[str, int]:
    output = subprocess.run(
        ["readelf", "-sW", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return {
        f[7]: int(f[1], 16)
        for f in (line.split() for line in output.splitlines())
        if len(f) == 8 and f[3] in ("FUNC", "IFUNC")
    }


@pytest.fixture
def arm64(tmp_path: Path) -> Path:
    # resolver: nop; adrp x0, 0x21000; add x0, x0, #0x10 (= impl); ret — then impl: ret
    code = struct.pack("<5I", NOP, ADRP_X0, ADD_X0_0x10, RET, RET)
    path = tmp_path / "arm64.so"
    path.write_bytes(
        programs.tiny_elf(
            EM_AARCH64, code, [("resolver", 0, 16, STT_GNU_IFUNC), ("impl", 16, 4, STT_FUNC)]
        )
    )
    assert _readelf_symbols(path) == {"resolver": 0x21000, "impl": 0x21010}
    return path


def test_aarch64_offsets_go_through_the_pt_load(arm64: Path) -> None:
    table = SymbolTable.for_path(arm64)
    assert table.machine_name == "aarch64"
    resolver = table.lookup("resolver")
    assert (resolver.vaddr, resolver.offset, resolver.is_ifunc) == (0x21000, 0x1000, True)
    assert table.lookup("impl").offset == 0x1010


def test_aarch64_boundaries(arm64: Path) -> None:
    table = SymbolTable.for_path(arm64)
    resolver = table.lookup("resolver")
    for offset in (0x1000, 0x1004, 0x1008, 0x100C):
        check_probe_offset(arm64, offset, resolver)
    with pytest.raises(SymbolError, match=r"inside the instruction at 0x1004 \(adrp x0") as error:
        check_probe_offset(arm64, 0x1006, resolver)
    assert "0x1004" in (error.value.hint or "") and "0x1008" in (error.value.hint or "")
    with pytest.raises(SymbolError, match="outside resolver"):
        check_probe_offset(arm64, 0x1010, resolver)


def test_aarch64_ifunc_implementations_from_adrp_add(arm64: Path) -> None:
    table = SymbolTable.for_path(arm64)
    assert [f.name for f in ifunc_implementations(table.lookup("resolver"), table)] == ["impl"]


def test_aarch64_virtual_address_is_explained(arm64: Path) -> None:
    with pytest.raises(SymbolError, match="virtual address") as error:
        check_probe_offset(arm64, 0x21004)
    assert "0x1004" in (error.value.hint or "")


def test_32_bit_big_endian(tmp_path: Path) -> None:
    path = tmp_path / "ppc32.so"
    path.write_bytes(
        programs.tiny_elf(
            EM_PPC,
            bytes(16),
            [("first", 0, 8, STT_FUNC), ("second", 8, 8, STT_FUNC)],
            elf_class=32,
            endian=">",
        )
    )
    assert _readelf_symbols(path) == {"first": 0x21000, "second": 0x21008}
    with ElfImage.from_path(path) as image:
        assert not image.is_64bit and image.endian == ">"
        assert [(s.offset, s.vaddr) for s in image.loads] == [(0x1000, 0x21000)]
    table = SymbolTable.for_path(path)
    assert [(f.name, f.offset, f.size) for f in table.functions] == [
        ("first", 0x1000, 8),
        ("second", 0x1008, 8),
    ]
    check_probe_offset(path, 0x1003)  # no decoder for this machine: segment checks only
    with pytest.raises(SymbolError, match="beyond the end"):
        check_probe_offset(path, 0x100000)


def test_function_without_size_extends_to_the_next_one(arm64: Path, tmp_path: Path) -> None:
    code = struct.pack("<4I", NOP, NOP, RET, RET)
    path = tmp_path / "nosize.so"
    path.write_bytes(
        programs.tiny_elf(EM_AARCH64, code, [("a", 0, 0, STT_FUNC), ("b", 12, 4, STT_FUNC)])
    )
    table = SymbolTable.for_path(path)
    unsized = table.lookup("a")
    check_probe_offset(path, 0x1008, unsized)
    with pytest.raises(SymbolError, match="outside a"):
        check_probe_offset(path, 0x100C, unsized)
