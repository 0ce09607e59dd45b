"""The USDT test targets (tests/targets/usdt/*.c) and the recipes that build their variants.

Everything compiles through tests/support/build.py (cached by content), so unit and integration
tests share the same files: the demo at -O0/-O2 as PIE and ET_EXEC, a stripped copy, a copy
whose notes live only in its separate debug file, the semaphore program, an ELFCLASS32 (i386)
program, and a C++ program that makes libstdc++'s own probe fire. Also here: readelf as the
independent oracle for notes and segments, and a "prelinked" copy made by moving the note
addresses the way prelink leaves them.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from support.build import compile_program

TARGETS = Path(__file__).resolve().parents[2] / "targets" / "usdt"


def _source(name: str) -> str:
    return (TARGETS / name).read_text()


def _pie_flags(pie: bool) -> list[str]:
    return ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]


def demo(pie: bool = True, optimize: str = "-O0") -> Path:
    """usdt_demo.c: <sys/sdt.h> probes and hand-written notes, no semaphores."""
    return compile_program(_source("usdt_demo.c"), "usdt_demo", [optimize, "-g", *_pie_flags(pie)])


def demo_stripped() -> Path:
    """The -O2 PIE demo after `strip --strip-all` (the notes survive: they are not debug info)."""
    return compile_program(
        _source("usdt_demo.c"),
        "usdt_demo_stripped",
        ["-O2", "-g", *_pie_flags(True)],
        post=[["strip", "--strip-all", "{out}"]],
    )


def demo_notes_in_debug_file() -> tuple[Path, Path]:
    """(binary, debug file): the binary lost .note.stapsdt and .symtab; its .debug kept both.

    The binary names the debug file in `.gnu_debuglink` (same directory).
    """
    binary = compile_program(
        _source("usdt_demo.c"),
        "usdt_demo_split",
        ["-O2", "-g", *_pie_flags(True)],
        post=[
            ["objcopy", "--only-keep-debug", "{out}", "{out}.debug"],
            ["strip", "--strip-all", "--remove-section=.note.stapsdt", "{out}"],
            ["objcopy", "--add-gnu-debuglink={out}.debug", "{out}"],
        ],
    )
    return binary, binary.with_name(binary.name + ".debug")


def gated(pie: bool = True) -> Path:
    """usdt_gated.c: probes with semaphores; `gated:hit` fires only while its semaphore is set."""
    return compile_program(_source("usdt_gated.c"), "usdt_gated", ["-O2", "-g", *_pie_flags(pie)])


def i386() -> Path | None:
    """usdt_i386.c as a static ELFCLASS32 i386 program, or None when gcc -m32 cannot build it."""
    try:
        return compile_program(
            _source("usdt_i386.c"),
            "usdt_i386",
            ["-m32", "-O2", "-nostdlib", "-static", "-I/usr/include/x86_64-linux-gnu"],
        )
    except subprocess.CalledProcessError:
        return None


def thrower() -> Path:
    """usdt_throw.cc: throws ints, so libstdc++'s libstdcxx:throw fires."""
    return compile_program(_source("usdt_throw.cc"), "usdt_throw", ["-O2"], language="c++")


# ---- readelf, the oracle ---------------------------------------------------------------------


class ReadelfNote(NamedTuple):
    provider: str
    name: str
    location: int
    base: int
    semaphore: int
    arguments: str


class ReadelfLoad(NamedTuple):
    offset: int
    vaddr: int
    filesz: int
    flags: str


def readelf_notes(path: Path) -> list[ReadelfNote]:
    """The stapsdt notes as binutils' readelf prints them (addresses as stored, not adjusted)."""
    text = _readelf("-nW", path)
    notes = []
    pattern = re.compile(
        r"Provider: (?P<provider>.*)\n\s*Name: (?P<name>.*)\n"
        r"\s*Location: (?P<location>0x[0-9a-f]+), Base: (?P<base>0x[0-9a-f]+),"
        r" Semaphore: (?P<semaphore>0x[0-9a-f]+)\n"
        r"\s*Arguments: ?(?P<arguments>.*)"
    )
    for match in pattern.finditer(text):
        notes.append(
            ReadelfNote(
                match["provider"],
                match["name"],
                int(match["location"], 16),
                int(match["base"], 16),
                int(match["semaphore"], 16),
                match["arguments"].strip(),
            )
        )
    return notes


def readelf_loads(path: Path) -> list[ReadelfLoad]:
    loads = []
    for line in _readelf("-lW", path).splitlines():
        fields = line.split()
        if fields and fields[0] == "LOAD":
            offset, vaddr, _paddr, filesz, _memsz = (int(f, 16) for f in fields[1:6])
            flags = "".join(fields[6:-1])
            loads.append(ReadelfLoad(offset, vaddr, filesz, flags))
    return loads


def readelf_section_address(path: Path, name: str) -> int | None:
    for line in _readelf("-SW", path).splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 3 and fields[1] == name:
            return int(fields[3], 16)
    return None


def oracle_offset(loads: list[ReadelfLoad], vaddr: int, flag: str) -> int:
    """The file offset of `vaddr` through the PT_LOAD (with `flag` among its flags) holding it."""
    for load in loads:
        if load.vaddr <= vaddr < load.vaddr + load.filesz and flag in load.flags:
            return vaddr - load.vaddr + load.offset
    raise AssertionError(f"{vaddr:#x} is in no {flag} PT_LOAD")


def _readelf(option: str, path: Path) -> str:
    return subprocess.run(
        ["readelf", option, str(path)], capture_output=True, text=True, check=False
    ).stdout


# ---- prelink, simulated ----------------------------------------------------------------------


def patch_notes(
    binary: Path,
    destination: Path,
    change: Callable[[str, int, int, int], tuple[int, int, int]],
    *,
    rename_base: bool = False,
) -> Path:
    """A copy of `binary` with each stapsdt note's (pc, base, semaphore) replaced by
    `change(name, pc, base, semaphore)`; `rename_base` renames `.stapsdt.base` away.

    Parsed here with struct from the section headers, independently of probescope's reader.
    """
    shutil.copyfile(binary, destination)
    data = bytearray(destination.read_bytes())
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    names_at = sections[shstrndx][4]

    def name_of(section: tuple[int, ...]) -> str:
        start = names_at + section[0]
        return data[start : data.index(0, start)].decode()

    notes = next(s for s in sections if name_of(s) == ".note.stapsdt")
    position, end = notes[4], notes[4] + notes[5]
    while position < end:
        namesz, descsz, _type = struct.unpack_from("<III", data, position)
        desc = position + 12 + ((namesz + 3) & ~3)
        strings = bytes(data[desc + 24 : desc + descsz]).split(b"\0")
        values = change(strings[1].decode(), *struct.unpack_from("<QQQ", data, desc))
        struct.pack_into("<QQQ", data, desc, *(v & 0xFFFF_FFFF_FFFF_FFFF for v in values))
        position = desc + ((descsz + 3) & ~3)
    if rename_base:
        base_section = next(s for s in sections if name_of(s) == ".stapsdt.base")
        start = names_at + base_section[0]
        data[start : start + len(".stapsdt.base")] = b".stapsdt.bas_"
    destination.write_bytes(bytes(data))
    return destination


def prelinked_copy(binary: Path, destination: Path, delta: int, *, keep_base: bool = True) -> Path:
    """A copy of `binary` whose notes say what they would before prelink moved it by `delta`.

    prelink relocates the file's sections (and `.stapsdt.base` with them) but not the unloaded
    note, so the note's probe, base and semaphore addresses stay `delta` below the new ones.
    With `keep_base=False` the `.stapsdt.base` section is renamed away, so no adjustment is
    possible and a reader must take the note's addresses as they are.
    """
    return patch_notes(
        binary,
        destination,
        lambda _name, pc, base, semaphore: (
            pc - delta,
            base - delta,
            semaphore and semaphore - delta,
        ),
        rename_base=not keep_base,
    )


def nm_addresses(path: Path) -> dict[str, int]:
    """Symbol → address from binutils' nm."""
    output = subprocess.run(["nm", str(path)], capture_output=True, text=True).stdout
    found = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 3:
            found[fields[2]] = int(fields[0], 16)
    return found
