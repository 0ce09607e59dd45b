"""kprobe definitions for the differential test against a kernel that has kprobe_events.

Symbols are real functions of every x86_64 kernel (`do_sys_openat2`, `vfs_read`) and data
(`jiffies`); address-form probes are left out of rendering checks because the kernel prints
them with `%p` (a hashed pointer).
"""

from __future__ import annotations

import itertools

HEADS = [
    "p",
    "r",
    "p:kev",
    "r:kev",
    "p:kg/kev",
    "p:kg/",
    "p:kg.kev",
    "r2:kev",
    "r4096:kev",
    "r4097:kev",
    "r0:kev",
    "p3:kev",
    "p:1bad",
    "rx:kev",
    "r10:kg/kev",
]
# Offsets other than 0 depend on the build (the kernel refuses a place that is not an
# instruction boundary, EILSEQ); their rendering is covered by the unit tests.
PLACES = [
    "do_sys_openat2",
    "do_sys_openat2+0",
    "do_sys_openat2+0x",
    "do_sys_openat2%return",
    "do_sys_openat2+4%return",
    "do_sys_openat2%ret",
    "do_sys_openat2-4",
    "vfs_read",
    "vfs_read+0x0",
]
ARGS = [
    "$arg3:u64",
    "+8($stack):x32[2]",
    "$comm:string",
    "\\-1:s8",
    "%di",
    "%ax",
    "%rax",
    "$arg1",
    "$arg2",
    "$arg0",
    "$argx",
    "$retval",
    "$comm",
    "$stack",
    "$stack1",
    "$stack99999",
    "@jiffies",
    "@jiffies+8",
    "@jiffies-8",
    "@+0x10",
    "+0(%di)",
    "+u0(%si):ustring",
    "+0($arg2):ustring",
    "+0($arg2):string",
    "%di:symbol",
    "$arg1:symstr",
    "%di:symstr",
    "@jiffies:u64",
    "\\1",
    '\\"k"',
    "+0(%di):u8[4]",
    "%di:b3@1/8",
    "name=+0($arg2):ustring",
    "x=$arg1:s32",
    "+0(+8(%di)):u32",
]


def kprobe_corpus() -> list[str]:
    specs: list[str] = []
    specs += [f"{head} do_sys_openat2" for head in HEADS]
    specs += [f"p:kev {place}" for place in PLACES]
    specs += [f"r:kev {place}" for place in PLACES]
    specs += [f"p:kev do_sys_openat2 {arg}" for arg in ARGS]
    specs += [f"r:kev do_sys_openat2 {arg}" for arg in ARGS]
    specs += [
        f"p:kg/kev vfs_read {a} {b}"
        for a, b in itertools.combinations(["%di", "$arg2", "$comm"], 2)
    ]
    return specs
