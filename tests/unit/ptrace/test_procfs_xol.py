"""Where XOL pages go in an address space (its maps parsed by system/maps.py)."""

from __future__ import annotations

import os

from probescope.engines.ptrace import xol
from probescope.system.maps import gaps, parse_maps

# A no-ASLR layout of a PIE program on x86_64 (setarch -R), trimmed.
MAPS = """\
555555554000-555555555000 r--p 00000000 fe:00 1234                       /tmp/prog
555555555000-555555556000 r-xp 00001000 fe:00 1234                       /tmp/prog
555555556000-555555557000 r--p 00002000 fe:00 1234                       /tmp/prog
555555558000-555555559000 rw-p 00003000 fe:00 1234                       /tmp/prog
555555559000-55555557a000 rw-p 00000000 00:00 0                          [heap]
7ffff7d8c000-7ffff7db2000 r--p 00000000 fe:00 339380                     /usr/lib/libc.so.6
7ffff7db2000-7ffff7f08000 r-xp 00026000 fe:00 339380                     /usr/lib/libc.so.6
7ffff7fc8000-7ffff7fca000 r-xp 00000000 00:00 0                          [vdso]
7ffff7fcb000-7ffff7ff1000 r-xp 00001000 fe:00 338944                     /usr/lib/ld.so
7ffff7ffd000-7ffff7fff000 rw-p 00033000 fe:00 338944                     /usr/lib/ld.so
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0                          [stack]
"""


def test_parse_maps():
    mappings = parse_maps(MAPS)
    text = mappings[1]
    assert (text.start, text.end, text.offset) == (0x555555555000, 0x555555556000, 0x1000)
    assert text.executable and text.private and not text.writable
    assert text.file_key == (os.makedev(0xFE, 0), 1234)
    assert text.contains_file_offset(0x1139) and not text.contains_file_offset(0x2000)
    assert text.address_of(0x1139) == 0x555555555139
    assert mappings[4].path == "[heap]" and mappings[4].inode == 0


def test_gaps():
    mappings = parse_maps(MAPS)
    found = list(gaps(mappings, 0x555555550000, 0x555555560000))
    assert found == [(0x555555550000, 0x555555554000), (0x555555557000, 0x555555558000)]


def test_libraries_get_pages_in_the_stack_gap_not_in_mmap_space():
    mappings = parse_maps(MAPS)
    libc_text = mappings[6]
    first = next(xol.candidate_starts(mappings, libc_text.start, libc_text.end, 4096, 8 << 20))
    assert first == 0x7FFFF7FFF000 + 4096  # just above the last mmap, far below the stack
    assert first + 4096 <= 0x7FFFFFFDE000 - (8 << 20)


def test_the_executable_gets_a_page_below_it_never_in_the_heap_or_stack():
    mappings = parse_maps(MAPS)
    exe_text = mappings[1]
    starts = list(
        xol.candidate_starts(
            mappings, exe_text.start, exe_text.end, 4096, 8 << 20, exe_text.file_key
        )
    )
    assert starts[0] == 0x555555554000 - 2 * 4096
    heap = mappings[4]
    stack = mappings[-1]
    for start in starts:
        assert not heap.start <= start < heap.end + (1 << 30)
        assert not stack.start - (8 << 20) <= start < stack.end
        assert xol.in_reach(start, exe_text.start) and xol.in_reach(start, exe_text.end)


def test_unlimited_stack_skips_the_stack_gap():
    mappings = parse_maps(MAPS)
    libc_text = mappings[6]
    first = next(xol.candidate_starts(mappings, libc_text.start, libc_text.end, 4096, None))
    assert first < libc_text.start


def test_before_the_heap_exists_brk_space_after_the_executable_is_left_alone():
    mappings = [m for m in parse_maps(MAPS) if m.path != "[heap]"]
    exe_text = mappings[1]
    data_end = mappings[3].end
    for start in xol.candidate_starts(
        mappings, exe_text.start, exe_text.end, 4096, 8 << 20, exe_text.file_key
    ):
        assert not data_end <= start < data_end + (1 << 30)
