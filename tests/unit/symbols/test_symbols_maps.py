"""/proc/PID/maps parsing and file offset ↔ runtime address, checked against real processes."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

from probescope.errors import SymbolError
from probescope.symbols.identity import file_identity
from probescope.symbols.maps import (
    Mapping,
    file_offset_of_address,
    mapped_file_path,
    mappings_of,
    parse_maps,
    read_maps,
    runtime_address,
    runtime_addresses,
)
from probescope.symbols.table import SymbolTable
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"

MAPS = "\n".join(
    [
        "55d0c8a00000-55d0c8a2e000 r--p 00000000 fe:00 1234       /usr/bin/bash",
        "55d0c8a2e000-55d0c8b0f000 r-xp 0002e000 fe:00 1234       /usr/bin/bash",
        "7f00aa000000-7f00aa021000 rw-p 00000000 00:00 0          [heap]",
        "7f00ab000000-7f00ab001000 r-xp 00001000 103:02 99 /tmp/dir with space/lib.so (deleted)",
        "7f00ac000000-7f00ac010000 rw-p 00000000 00:00 0 ",
        "7ffd4a7f2000-7ffd4a7f4000 r-xp 00000000 00:00 0          [vdso]",
    ]
)


def test_parse_maps_fields() -> None:
    bash_ro, bash_text, heap, deleted, anonymous, vdso = parse_maps(MAPS)
    assert (bash_text.start, bash_text.end, bash_text.offset) == (
        0x55D0C8A2E000,
        0x55D0C8B0F000,
        0x2E000,
    )
    assert bash_text.device == os.makedev(0xFE, 0) and bash_text.inode == 1234
    assert bash_text.executable and not bash_ro.executable
    assert bash_text.path == "/usr/bin/bash" and bash_text.is_file
    assert heap.path == "[heap]" and not heap.is_file
    assert deleted.path == "/tmp/dir with space/lib.so" and deleted.deleted
    assert deleted.device == os.makedev(0x103, 2)
    assert anonymous.path is None and not anonymous.is_file
    assert vdso.path == "[vdso]"
    assert bash_text.address_of(0x2E010) == 0x55D0C8A2E010
    assert bash_text.file_offset_of(0x55D0C8A2E010) == 0x2E010
    assert bash_text.contains_file_offset(0x2E000) and not bash_text.contains_file_offset(0x2D000)


def test_parse_maps_rejects_garbage() -> None:
    with pytest.raises(SymbolError, match="line 1"):
        parse_maps("this is not a maps line\n")


def test_runtime_address_of_malloc_is_what_dlsym_says() -> None:
    table = SymbolTable.for_path(LIBC)
    malloc = table.lookup("malloc")
    expected = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    assert runtime_address(os.getpid(), LIBC, malloc.offset) == expected
    assert runtime_address("self", table.identity, malloc.offset) == expected
    assert runtime_address("self", file_identity(LIBC).key, malloc.offset) == expected
    assert runtime_addresses("self", LIBC, malloc.offset) == [expected]
    found = file_offset_of_address("self", expected)
    assert found is not None
    mapping, offset = found
    assert offset == malloc.offset and mapping.executable


def test_runtime_address_in_a_child_process_matches_what_it_prints() -> None:
    binary = programs.demo(pie=True, optimize="-O2")
    function = SymbolTable.for_path(binary).lookup("ps_add")
    child = subprocess.Popen(
        [str(binary), "1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PS_SHOW_ADDRESS": "1"},
    )
    try:
        assert child.stdout is not None
        printed = int(child.stdout.readline(), 16)
        assert runtime_address(child.pid, binary, function.offset) == printed
        found = file_offset_of_address(child.pid, printed)
        assert found is not None and found[1] == function.offset
    finally:
        child.kill()
        child.wait()


def test_unmapped_file_and_offset_errors() -> None:
    binary = programs.demo()
    with pytest.raises(SymbolError, match="not mapped"):
        runtime_address("self", binary, 0x1000)
    assert runtime_addresses("self", binary, 0x1000) == []
    size = file_identity(LIBC).size
    with pytest.raises(SymbolError, match="file offset"):
        runtime_address("self", LIBC, size + 0x100000)


def test_mappings_of_libc() -> None:
    mapped = mappings_of(os.getpid(), LIBC)
    assert any(m.executable for m in mapped)
    assert all(m.inode == file_identity(LIBC).inode for m in mapped)


def test_read_maps_of_a_missing_process() -> None:
    with pytest.raises(SymbolError, match="no process"):
        read_maps(2**22 + 12345)


def test_mapped_file_path_handles_container_and_chroot_paths(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    program = root / "bin" / "prog"
    program.write_bytes(b"x")
    identity = file_identity(program)
    inside = Mapping(0x1000, 0x2000, "r-xp", 0, identity.device, identity.inode, "/bin/prog")
    assert mapped_file_path("self", inside, str(root)) == str(program)  # container: root + path
    host = inside._replace(path=str(program))
    assert mapped_file_path("self", host, str(root)) == str(program)  # chroot: the host path
    other = inside._replace(inode=identity.inode + 1)
    assert mapped_file_path("self", other, str(root)) is None
