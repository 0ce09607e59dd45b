"""The one /proc/PID/maps parser and Mapping: captured maps text, the odd lines the kernel
prints (spaces and ` (deleted)` in paths, anonymous and special mappings), and this process."""

from __future__ import annotations

import ctypes
import os

import pytest

from probescope.errors import ProcessError
from probescope.system.maps import Mapping, gaps, mapping_at, parse_maps, read_maps

# Captured from a PIE bash and a process holding a deleted library (trimmed).
MAPS = "\n".join(
    [
        "55d0c8a00000-55d0c8a2e000 r--p 00000000 fe:00 1234       /usr/bin/bash",
        "55d0c8a2e000-55d0c8b0f000 r-xp 0002e000 fe:00 1234       /usr/bin/bash",
        "7f00aa000000-7f00aa021000 rw-p 00000000 00:00 0          [heap]",
        "7f00ab000000-7f00ab001000 r-xp 00001000 103:02 99 /tmp/dir with space/lib.so (deleted)",
        "7f00ac000000-7f00ac010000 rw-p 00000000 00:00 0 ",
        "7f00ad000000-7f00ad001000 rw-s 00000000 00:01 5          /dev/zero (deleted)",
        "7ffd4a7f2000-7ffd4a7f4000 r-xp 00000000 00:00 0          [vdso]",
    ]
)


def test_fields_of_each_kind_of_line() -> None:
    bash_ro, bash_text, heap, deleted, anonymous, shared, vdso = parse_maps(MAPS)
    assert (bash_text.start, bash_text.end, bash_text.offset) == (
        0x55D0C8A2E000,
        0x55D0C8B0F000,
        0x2E000,
    )
    assert bash_text.device == os.makedev(0xFE, 0) and bash_text.inode == 1234
    assert bash_text.file_key == (os.makedev(0xFE, 0), 1234) == bash_ro.file_key
    assert bash_text.executable and not bash_ro.executable
    assert bash_text.private and not bash_text.writable
    assert bash_text.path == "/usr/bin/bash" and bash_text.is_file and not bash_text.deleted
    assert heap.path == "[heap]" and not heap.is_file and heap.writable
    assert deleted.path == "/tmp/dir with space/lib.so" and deleted.deleted
    assert deleted.device == os.makedev(0x103, 2) and deleted.is_file
    assert anonymous.path is None and not anonymous.is_file and anonymous.inode == 0
    assert shared.path == "/dev/zero" and shared.deleted and not shared.private
    assert vdso.path == "[vdso]" and vdso.executable and not vdso.is_file


def test_offset_to_vaddr_and_back() -> None:
    text = parse_maps(MAPS)[1]
    assert text.size == 0x55D0C8B0F000 - 0x55D0C8A2E000
    assert text.address_of(0x2E010) == 0x55D0C8A2E010
    assert text.file_offset_of(0x55D0C8A2E010) == 0x2E010
    assert text.contains_file_offset(0x2E000) and not text.contains_file_offset(0x2D000)
    assert not text.contains_file_offset(0x2E000 + text.size)
    assert text.contains_address(text.start) and not text.contains_address(text.end)


def test_mapping_is_a_value() -> None:
    inside = Mapping(0x1000, 0x2000, "r-xp", 0, 5, 7, "/bin/prog")
    assert inside._replace(inode=8) != inside and not inside.deleted
    assert parse_maps("1000-2000 r-xp 00000000 00:05 7 /bin/prog\n") == [inside]


def test_garbage_is_refused_with_its_line_number() -> None:
    with pytest.raises(ProcessError, match="line 1"):
        parse_maps("this is not a maps line\n")
    with pytest.raises(ProcessError, match="line 2"):
        parse_maps("1000-2000 r-xp 00000000 00:05 7 /bin/prog\n1000-zz r-xp 0 00:00 0\n")
    with pytest.raises(ProcessError, match="line 1"):
        parse_maps("1000-2000 r-x 00000000 00:05 7 /bin/prog\n")  # perms are 4 letters


def test_mapping_at_and_gaps() -> None:
    mappings = parse_maps(MAPS)
    assert mapping_at(mappings, 0x55D0C8A2E123) == mappings[1]
    assert mapping_at(mappings, 0x55D0C8B0F000) is None
    found = list(gaps(mappings, 0x55D0C8900000, 0x55D0C8C00000))
    assert found == [(0x55D0C8900000, 0x55D0C8A00000), (0x55D0C8B0F000, 0x55D0C8C00000)]
    assert list(gaps([], 0, 10)) == [(0, 10)]


def test_this_process_maps_libc_where_dlsym_finds_malloc() -> None:
    address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    assert address is not None
    mapping = mapping_at(read_maps("self"), address)
    assert mapping is not None and mapping.executable and mapping.is_file
    assert mapping.path is not None and os.path.basename(mapping.path).startswith("libc")
    st = os.stat(mapping.path)
    assert mapping.file_key == (st.st_dev, st.st_ino)
    assert read_maps(os.getpid())[0].start == read_maps()[0].start


def test_read_maps_of_a_missing_process() -> None:
    with pytest.raises(ProcessError, match="no process"):
        read_maps(2**22 + 12345)
