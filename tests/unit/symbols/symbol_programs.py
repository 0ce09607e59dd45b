"""C test targets for the symbols layer and the recipes that build their variants.

Each builder compiles through tests/support/build.py (cached by content), so unit and
integration tests share the same files: PIE and non-PIE at -O0/-O2, a versioned shared library
with an IFUNC and a program linked to it, stripped copies whose symbols live in a build-id
debug file, behind .gnu_debuglink, or in MiniDebugInfo (.gnu_debugdata, built as Fedora's
find-debuginfo does), and a copy with duplicate symbol names added by objcopy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from support.build import CACHE, compile_program

DEMO_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ps_global_counter = 7;

__attribute__((noinline)) int ps_add(int a, int b) { return a * 3 + b; }

__attribute__((noinline)) static int ps_static_helper(int x)
{
    volatile int y = x;
    return y + 1;
}

__attribute__((noinline)) void ps_alias_target(void) { __asm__ volatile(""); }
void ps_alias(void) __attribute__((alias("ps_alias_target")));
void ps_weak_alias(void) __attribute__((weak, alias("ps_alias_target")));

__attribute__((noinline)) size_t ps_measure(const char *text) { return strlen(text); }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    int total = 0;
    for (int i = 0; i < n; i++)
        total += ps_add(i, total) + ps_static_helper(i);
    ps_alias();
    size_t length = 0;
    for (int i = 2; i < argc; i++)
        length += ps_measure(argv[i]);
    if (getenv("PS_SHOW_ADDRESS")) {
        printf("%p\n", (void *)ps_add);
        fflush(stdout);
        sleep(30);
    }
    printf("%d %zu %d\n", total, length, ps_global_counter);
    return 0;
}
"""

IFUNC_PROGRAM_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>

static volatile int ps_prefer_slow;
__attribute__((noinline)) static int ps_impl_slow(int x) { return x + 100; }
__attribute__((noinline)) static int ps_impl_fast(int x) { return x + 200; }
static void *ps_resolve(void)
{
    return ps_prefer_slow ? (void *)ps_impl_slow : (void *)ps_impl_fast;
}
int ps_dispatch(int) __attribute__((ifunc("ps_resolve")));

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1, total = 0;
    for (int i = 0; i < n; i++)
        total += ps_dispatch(i);
    printf("%d\n", total);
    return 0;
}
"""

LIBRARY_SOURCE = r"""
__asm__(".symver ps_old_impl, ps_versioned@VERS_1");
__asm__(".symver ps_new_impl, ps_versioned@@VERS_2");
__attribute__((noinline)) int ps_old_impl(int x) { return x + 1; }
__attribute__((noinline)) int ps_new_impl(int x) { return x + 2; }
__attribute__((noinline)) int ps_lib_func(int x) { return x * 7; }

static volatile int ps_prefer_slow;
__attribute__((noinline)) static int ps_impl_slow(int x) { return x + 100; }
__attribute__((noinline)) static int ps_impl_fast(int x) { return x + 200; }
static void *ps_resolve(void)
{
    return ps_prefer_slow ? (void *)ps_impl_slow : (void *)ps_impl_fast;
}
int ps_dispatch(int) __attribute__((ifunc("ps_resolve")));
int ps_lib_counter;
"""

VERSION_SCRIPT = """\
VERS_1 { global: ps_versioned; ps_lib_func; ps_dispatch; ps_lib_counter; local: *; };
VERS_2 { global: ps_versioned; } VERS_1;
"""

LIBRARY_USER_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
int ps_versioned(int);
int ps_lib_func(int);
int ps_dispatch(int);
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1, total = 0;
    for (int i = 0; i < n; i++)
        total += ps_versioned(i) + ps_lib_func(i) + ps_dispatch(i);
    printf("%d\n", total);
    return 0;
}
"""

STRLEN_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += strlen(argv[0] + (i % 2));
    printf("%zu\n", total);
    return 0;
}
"""

# Fedora's find-debuginfo.sh `add_minidebug`: keep the function symbols missing from .dynsym,
# strip everything else, xz the result and add it as .gnu_debugdata to the stripped binary.
MINIDEBUGINFO_SCRIPT = r"""
set -e
out="$1"
nm -D "$out" --format=posix --defined-only | awk '{ print $1 }' | sort > "$out.dynsyms"
nm "$out" --format=posix --defined-only \
    | awk '{ if ($2 == "T" || $2 == "t" || $2 == "D") print $1 }' | sort > "$out.funcsyms"
comm -13 "$out.dynsyms" "$out.funcsyms" > "$out.keep"
objcopy --only-keep-debug "$out" "$out.debug"
objcopy -S --remove-section .gdb_index --remove-section .comment \
    --keep-symbols="$out.keep" "$out.debug" "$out.mini"
xz -f "$out.mini"
strip --strip-all "$out"
objcopy --add-section .gnu_debugdata="$out.mini.xz" "$out"
rm -f "$out.debug" "$out.dynsyms" "$out.funcsyms" "$out.keep" "$out.mini.xz"
"""

# Adds two local `ps_dup` at different functions, and `ps_pref` weak at one, global at another.
DUPLICATES_SCRIPT = r"""
import subprocess, sys
out = sys.argv[1]
def address(name):
    for line in subprocess.run(["nm", out], capture_output=True, text=True).stdout.splitlines():
        fields = line.split()
        if fields[-1] == name:
            return int(fields[0], 16)
    raise SystemExit(f"no {name}")
text = None
sections = subprocess.run(["readelf", "-SW", out], capture_output=True, text=True).stdout
for line in sections.splitlines():
    fields = line.replace("[ ", "[").split()
    if len(fields) > 3 and fields[1] == ".text":
        text = int(fields[3], 16)
a, b = address("ps_add") - text, address("ps_static_helper") - text
subprocess.run(["objcopy",
    "--add-symbol", f"ps_dup=.text:{a:#x},function,local",
    "--add-symbol", f"ps_dup=.text:{b:#x},function,local",
    "--add-symbol", f"ps_pref=.text:{a:#x},function,weak",
    "--add-symbol", f"ps_pref=.text:{b:#x},function,global",
    out], check=True)
"""


def demo(pie: bool = True, optimize: str = "-O0") -> Path:
    """The demo program: PIE (default) or ET_EXEC (-no-pie), with debug info and .symtab."""
    flags = [optimize, "-g", "-fPIE", "-pie"] if pie else [optimize, "-g", "-fno-pie", "-no-pie"]
    return compile_program(DEMO_SOURCE, "psdemo", flags)


STRIPPED_FLAGS = ("-O2", "-g", "-Wl,--build-id=sha1")
MINIDEBUGINFO_FLAGS = ("-O2", "-g", "-rdynamic")


def unstripped_twin(name: str) -> Path:
    """The same link as a stripped variant, before stripping: the oracle for its offsets."""
    flags = MINIDEBUGINFO_FLAGS if name == "psminidebug" else STRIPPED_FLAGS
    return compile_program(DEMO_SOURCE, name, flags)


def stripped_with_build_id() -> tuple[Path, Path]:
    """(stripped PIE, its debug file); the debug file is not yet under any .build-id tree."""
    binary = compile_program(
        DEMO_SOURCE,
        "psbuildid",
        STRIPPED_FLAGS,
        post=[
            ["objcopy", "--only-keep-debug", "{out}", "{out}.debug"],
            ["strip", "--strip-all", "{out}"],
        ],
    )
    return binary, binary.with_name(binary.name + ".debug")


def stripped_with_debuglink() -> tuple[Path, Path]:
    """(stripped PIE with .gnu_debuglink, the debug file it names, in the same directory)."""
    binary = compile_program(
        DEMO_SOURCE,
        "psdebuglink",
        STRIPPED_FLAGS,
        post=[
            ["objcopy", "--only-keep-debug", "{out}", "{out}.dbg"],
            ["strip", "--strip-all", "{out}"],
            ["objcopy", "--add-gnu-debuglink={out}.dbg", "{out}"],
        ],
    )
    return binary, binary.with_name(binary.name + ".dbg")


def minidebuginfo() -> Path:
    """A stripped PIE whose local functions survive only in .gnu_debugdata."""
    return compile_program(
        DEMO_SOURCE,
        "psminidebug",
        MINIDEBUGINFO_FLAGS,
        post=[["sh", "-c", MINIDEBUGINFO_SCRIPT, "sh", "{out}"]],
    )


def duplicates() -> Path:
    """The demo with an ambiguous `ps_dup` and a weak/global `ps_pref` pair."""
    return compile_program(
        DEMO_SOURCE,
        "psdups",
        ["-O2", "-g"],
        post=[[sys.executable, "-c", DUPLICATES_SCRIPT, "{out}"]],
    )


def ifunc_program() -> Path:
    return compile_program(IFUNC_PROGRAM_SOURCE, "psifunc", ["-O2", "-g"])


def strlen_program() -> Path:
    return compile_program(STRLEN_SOURCE, "psstrlen", ["-O2", "-g"])


def _version_script() -> Path:
    digest = hashlib.sha256(VERSION_SCRIPT.encode()).hexdigest()[:16]
    path = CACHE / "version-scripts" / f"psvers-{digest}.map"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(VERSION_SCRIPT)
        temporary.replace(path)
    return path


def versioned_library() -> Path:
    """libpsvers.so: ps_versioned@VERS_1 / @@VERS_2, ps_lib_func, IFUNC ps_dispatch."""
    script = _version_script()
    return compile_program(
        LIBRARY_SOURCE,
        "libpsvers.so",
        ["-O2", "-g", "-shared", "-fPIC", f"-Wl,--version-script={script}"],
    )


def library_user() -> tuple[Path, Path]:
    """(a program calling libpsvers.so's functions, the library it runs with)."""
    library = versioned_library()
    directory = str(library.parent)
    program = compile_program(
        LIBRARY_USER_SOURCE,
        "psuser",
        # the build helper puts flags before the source: keep the library despite --as-needed
        ["-O2", "-g", f"-Wl,-rpath,{directory}", "-Wl,--no-as-needed", str(library)],
    )
    return program, library


def build_id_tree(root: Path, binary: Path, debug_file: Path) -> Path:
    """Install `debug_file` as `root/.build-id/xx/rest.debug` for `binary`; returns root."""
    build_id = read_build_id(binary)
    target = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(debug_file, target)
    return root


def read_build_id(binary: Path) -> str:
    """The build-id as `readelf -n` prints it (an oracle independent of probescope)."""
    output = subprocess.run(
        ["readelf", "-n", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    for line in output.splitlines():
        if "Build ID:" in line:
            return line.split("Build ID:")[1].strip()
    raise AssertionError(f"{binary} has no build-id")


def nm_addresses(binary: Path, dynamic: bool = False) -> dict[str, int]:
    """name → value of defined symbols as nm prints them (versioned names kept)."""
    command = ["nm", "--defined-only", *(["-D"] if dynamic else []), str(binary)]
    found: dict[str, int] = {}
    for line in subprocess.run(command, capture_output=True, text=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 3:
            found.setdefault(fields[2], int(fields[0], 16))
    return found


def objdump_instructions(binary: Path, symbol: str) -> list[int]:
    """Virtual addresses of every instruction of `symbol`, as objdump decodes it."""
    output = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--disassemble={symbol}", str(binary)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    addresses = []
    inside = False
    for line in output.splitlines():
        if line.endswith(f"<{symbol}>:"):
            inside = True
            continue
        if inside:
            head = line.strip().split(":", 1)[0]
            if not line.strip():
                break
            try:
                addresses.append(int(head, 16))
            except ValueError:
                continue
    return addresses


def tiny_elf(
    machine: int,
    code: bytes,
    functions: list[tuple[str, int, int, int]],
    *,
    elf_class: int = 64,
    endian: str = "<",
) -> bytes:
    """A minimal ET_DYN for machines gcc here cannot target: one R+X PT_LOAD holding `code` at
    file offset 0x1000 but vaddr 0x21000, and a .symtab with global `functions` given as
    (name, offset into code, size, STT_ type). readelf reads it; the tests use it as their
    oracle."""
    wide = elf_class == 64
    text_offset, text_vaddr = 0x1000, 0x21000
    ehsize, phentsize, shentsize, symsize = (64, 56, 64, 24) if wide else (52, 32, 40, 16)
    strtab = b"\0"
    symbols = [bytes(symsize)]
    for name, offset, size, kind in functions:
        info = (1 << 4) | kind  # STB_GLOBAL
        if wide:
            entry = struct.pack(
                f"{endian}IBBHQQ", len(strtab), info, 0, 1, text_vaddr + offset, size
            )
        else:
            entry = struct.pack(
                f"{endian}IIIBBH", len(strtab), text_vaddr + offset, size, info, 0, 1
            )
        symbols.append(entry)
        strtab += name.encode() + b"\0"
    names = [b"", b".text", b".symtab", b".strtab", b".shstrtab"]
    shstrtab = b"\0".join(names) + b"\0"
    name_offsets = [shstrtab.index(b"\0" + n + b"\0") + 1 if n else 0 for n in names]
    symtab = b"".join(symbols)
    symtab_offset = text_offset + len(code)
    strtab_offset = symtab_offset + len(symtab)
    shstrtab_offset = strtab_offset + len(strtab)
    shoff = (shstrtab_offset + len(shstrtab) + 7) & ~7
    osabi_gnu = 3  # STT_GNU_IFUNC is only meaningful with ELFOSABI_GNU
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if endian == "<" else 2, 1, osabi_gnu])
    ident += bytes(8)
    header = ident + struct.pack(
        f"{endian}HHI{'QQQ' if wide else 'III'}IHHHHHH",
        3,  # ET_DYN
        machine,
        1,
        text_vaddr,
        ehsize,
        shoff,
        0,
        ehsize,
        phentsize,
        1,
        shentsize,
        5,
        4,
    )
    if wide:
        phdr = struct.pack(
            f"{endian}IIQQQQQQ",
            1,
            5,
            text_offset,
            text_vaddr,
            text_vaddr,
            len(code),
            len(code),
            0x1000,
        )
    else:
        phdr = struct.pack(
            f"{endian}IIIIIIII",
            1,
            text_offset,
            text_vaddr,
            text_vaddr,
            len(code),
            len(code),
            5,
            0x1000,
        )
    sections = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (name_offsets[1], 1, 6, text_vaddr, text_offset, len(code), 0, 0, 4, 0),
        (name_offsets[2], 2, 0, 0, symtab_offset, len(symtab), 3, 1, 8, symsize),
        (name_offsets[3], 3, 0, 0, strtab_offset, len(strtab), 0, 0, 1, 0),
        (name_offsets[4], 3, 0, 0, shstrtab_offset, len(shstrtab), 0, 0, 1, 0),
    ]
    shdr_format = f"{endian}IIQQQQIIQQ" if wide else f"{endian}IIIIIIIIII"
    image = bytearray(header + phdr)
    image += bytes(text_offset - len(image))
    image += code + symtab + strtab + shstrtab
    image += bytes(shoff - len(image))
    for fields in sections:
        image += struct.pack(shdr_format, *fields)
    return bytes(image)
