"""File offset ↔ runtime address and the files behind mappings, checked against real processes
(the maps parser itself: tests/unit/system)."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

from probescope.errors import SymbolError
from probescope.symbols.identity import file_identity
from probescope.symbols.maps import (
    file_offset_of_address,
    map_files_path,
    mapped_file,
    mapped_file_path,
    mappings_of,
    runtime_address,
    runtime_addresses,
)
from probescope.symbols.table import SymbolTable
from probescope.system.maps import Mapping
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


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


def test_map_files_path_reaches_the_mapped_inode_only() -> None:
    libc = next(m for m in mappings_of("self", LIBC) if m.executable)
    path = map_files_path("self", libc)
    assert path is not None and os.stat(path).st_ino == file_identity(LIBC).inode
    assert map_files_path("self", libc._replace(inode=libc.inode + 1)) is None
    opened = mapped_file("self", libc)
    assert opened is not None and os.path.samefile(opened, LIBC)
    gone = libc._replace(path="/nonexistent/libc.so.6")  # as if deleted: the link still opens it
    assert mapped_file("self", gone) == path
