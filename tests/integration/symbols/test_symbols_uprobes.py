"""The offsets the symbols layer computes are where the kernel's uprobes really fire.

Each test defines `p:probescope_symtest_<pid>/xN PATH:0xOFF` in uprobe_events, enables it in a
private instance `instances/probescope-symtest-<pid>`, runs a program, counts the hits of that
program's pid in the instance's `trace`, and removes everything again (also on failure).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from probescope.symbols.elfimage import EM_X86_64
from probescope.symbols.ifunc import resolve_ifunc
from probescope.symbols.insn import check_probe_offset, decode
from probescope.symbols.locate import locate_binary
from probescope.symbols.table import SymbolTable, clear_memory_cache
from support.build import compile_program
from support.tracefs import append as tracefs_append
from support.tracefs import leftovers, tracefs_root
from support.tracefs import write as tracefs_write
from unit.symbols import symbol_programs as programs

pytestmark = pytest.mark.root

OWNER = os.getpid()
GROUP = f"probescope_symtest_{OWNER}"
INSTANCE = f"probescope-symtest-{OWNER}"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
_names = itertools.count()
_LINE = re.compile(r"^\s*(?P<comm>.*)-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]")


class Probe:
    """One enabled uprobe event in the private instance; counts hits per pid."""

    def __init__(self, instance: Path, event: str) -> None:
        self.instance = instance
        self.event = event

    def hits(self, pid: int) -> int:
        count = 0
        marker = f" {self.event}: ("
        for line in (self.instance / "trace").read_text().splitlines():
            if line.startswith("#") or marker not in line:
                continue
            match = _LINE.match(line)
            if match and int(match.group("pid")) == pid:
                count += 1
        return count


class Tracing:
    """The private instance of one test; `uprobe()` defines and enables one event in it."""

    def __init__(self, root: Path, instance: Path) -> None:
        self.root = root
        self.instance = instance

    @contextmanager
    def uprobe(self, path: str | Path, offset: int) -> Iterator[Probe]:
        event = f"x{next(_names)}"
        enable = self.instance / "events" / GROUP / event / "enable"
        defined = enabled = False
        try:
            tracefs_append(self.root / "uprobe_events", f"p:{GROUP}/{event} {path}:{offset:#x}\n")
            defined = True
            tracefs_write(enable, "1")
            enabled = True
            yield Probe(self.instance, event)
        finally:
            if enabled:
                tracefs_write(enable, "0")
            if defined:
                tracefs_append(self.root / "uprobe_events", f"-:{GROUP}/{event}\n")


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    root = tracefs_root()
    assert root is not None
    instance = root / "instances" / INSTANCE
    instance.mkdir()
    try:
        yield Tracing(root, instance)
    finally:
        instance.rmdir()


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    clear_memory_cache()
    yield
    ours = [line for line in leftovers() if "symtest" in line or str(OWNER) in line]
    assert ours == []


def _run(*argv: str | Path, **kwargs) -> int:  # type: ignore[no-untyped-def]
    process = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL, **kwargs)
    assert process.wait(timeout=60) == 0
    return process.pid


@pytest.mark.parametrize(
    "pie, optimize", [(True, "-O0"), (True, "-O2"), (False, "-O0"), (False, "-O2")]
)
def test_function_entry_in_pie_and_et_exec(pie: bool, optimize: str, tracing: Tracing) -> None:
    binary = programs.demo(pie=pie, optimize=optimize)
    function = SymbolTable.for_path(binary).lookup("ps_add")
    with tracing.uprobe(binary, function.offset) as probe:
        pid = _run(binary, "5")
        assert probe.hits(pid) == 5


def test_symbol_plus_offset_on_an_instruction_boundary(tracing: Tracing) -> None:
    binary = programs.demo(pie=True, optimize="-O0")
    table = SymbolTable.for_path(binary)
    function = table.lookup("ps_add")
    code = binary.read_bytes()[function.offset : function.end_offset]
    second = decode(code, function.vaddr, EM_X86_64)[1]
    offset = function.offset + second.address - function.vaddr
    check_probe_offset(binary, offset, function)
    with tracing.uprobe(binary, offset) as probe:
        pid = _run(binary, "4")
        assert probe.hits(pid) == 4


def test_shared_library_functions_and_versions(tracing: Tracing) -> None:
    program, library = programs.library_user()
    table = SymbolTable.for_path(library)
    default = table.lookup("ps_versioned")
    old = table.lookup("ps_versioned@VERS_1")
    plain = table.lookup("ps_lib_func")
    with (
        tracing.uprobe(library, default.offset) as new_probe,
        tracing.uprobe(library, old.offset) as old_probe,
        tracing.uprobe(library, plain.offset) as plain_probe,
    ):
        pid = _run(program, "3")
        assert new_probe.hits(pid) == 3  # the program was linked against @@VERS_2
        assert old_probe.hits(pid) == 0
        assert plain_probe.hits(pid) == 3


def test_ifunc_resolution_finds_the_implementation_that_runs(tracing: Tracing) -> None:
    program, library = programs.library_user()
    table = SymbolTable.for_path(library)
    dispatch = table.lookup("ps_dispatch")
    chosen = resolve_ifunc(library, dispatch, table)
    with (
        tracing.uprobe(library, chosen.offset) as implementation,
        tracing.uprobe(library, dispatch.offset) as resolver,
    ):
        pid = _run(program, "6")
        assert implementation.hits(pid) == 6
        assert resolver.hits(pid) <= 1  # the resolver runs once, at relocation


def test_libc_strlen_ifunc_resolution(tracing: Tracing) -> None:
    table = SymbolTable.for_path(LIBC)
    chosen = resolve_ifunc(LIBC, table.lookup("strlen"), table)
    binary = programs.strlen_program()
    with tracing.uprobe(LIBC, chosen.offset) as probe:
        pid = _run(binary, "7")
        assert probe.hits(pid) >= 7


def test_libc_malloc_from_python(tracing: Tracing) -> None:
    malloc = SymbolTable.for_path(locate_binary("c")).lookup("malloc")
    with tracing.uprobe(LIBC, malloc.offset) as probe:
        pid = _run("/usr/bin/python3.11", "-c", "x = [bytearray(100000) for _ in range(3)]")
        assert probe.hits(pid) >= 3


def test_python_et_exec_dynsym_function(tracing: Tracing) -> None:
    table = SymbolTable.for_path("/usr/bin/python3.11")
    assert table.type_name == "ET_EXEC"
    function = table.lookup("Py_BytesMain")
    with tracing.uprobe("/usr/bin/python3.11", function.offset) as probe:
        pid = _run("/usr/bin/python3.11", "-c", "pass")
        assert probe.hits(pid) == 1


def test_bash_main_and_execute_command(tracing: Tracing) -> None:
    bash = locate_binary("bash")
    table = SymbolTable.for_path(bash)
    main = table.lookup("main")
    execute = table.lookup("execute_command")
    with (
        tracing.uprobe(bash, main.offset) as main_probe,
        tracing.uprobe(bash, execute.offset) as execute_probe,
    ):
        pid = _run(bash, "-c", "for i in 1 2 3; do echo $i; done")
        assert main_probe.hits(pid) == 1
        assert execute_probe.hits(pid) >= 1


def test_stripped_binary_with_build_id_debug_file(tmp_path: Path, tracing: Tracing) -> None:
    binary, debug_file = programs.stripped_with_build_id()
    root = programs.build_id_tree(tmp_path / "debug", binary, debug_file)
    table = SymbolTable.for_path(binary, debug_dirs=[str(root)])
    helper = table.lookup("ps_static_helper")
    with tracing.uprobe(binary, helper.offset) as probe:
        pid = _run(binary, "3")
        assert probe.hits(pid) == 3


def test_stripped_binary_with_debuglink(tracing: Tracing) -> None:
    binary, _ = programs.stripped_with_debuglink()
    function = SymbolTable.for_path(binary, debug_dirs=[]).lookup("ps_add")
    with tracing.uprobe(binary, function.offset) as probe:
        pid = _run(binary, "2")
        assert probe.hits(pid) == 2


def test_minidebuginfo_local_function(tracing: Tracing) -> None:
    binary = programs.minidebuginfo()
    helper = SymbolTable.for_path(binary, debug_dirs=[]).lookup("ps_static_helper")
    assert helper.source == "minidebuginfo"
    with tracing.uprobe(binary, helper.offset) as probe:
        pid = _run(binary, "4")
        assert probe.hits(pid) == 4


STATIC_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int ps_add(int a, int b) { return a * 3 + b; }
int main(int argc, char **argv)
{
    char line[16];
    int n = argc > 1 ? atoi(argv[1]) : 1, total = 0;
    if (!fgets(line, sizeof line, stdin))
        return 1;
    for (int i = 0; i < n; i++)
        total += ps_add(i, total);
    printf("%d\n", total);
    return 0;
}
"""


def test_process_in_another_root_is_probed_through_proc_pid_root(
    tmp_path: Path, tracing: Tracing
) -> None:
    """A chrooted process (a container without the namespaces): names resolve in its root."""
    static = compile_program(STATIC_SOURCE, "psstatic", ["-O2", "-static"])
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(static, root / "bin" / "psstatic")
    (root / "lib1").mkdir()
    library = compile_program(
        "int ps_marker(void) { return 1; }\n",
        "libpsfoo.so.1",
        ["-O2", "-shared", "-fPIC", "-Wl,-soname,libpsfoo.so.1"],
    )
    shutil.copyfile(library, root / "lib1" / "libpsfoo.so.1")
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.conf").write_text("/lib1\n")
    subprocess.run(
        ["ldconfig", "-r", str(root), "-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"],
        check=True,
        capture_output=True,
    )
    child = subprocess.Popen(
        ["chroot", str(root), "/bin/psstatic", "5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(500):  # until `chroot` has exec'ed the program
            if os.path.basename(os.readlink(f"/proc/{child.pid}/exe")) == "psstatic":
                break
            time.sleep(0.01)
        located = locate_binary("/bin/psstatic", child.pid)
        assert str(located) == f"/proc/{child.pid}/root/bin/psstatic"
        from_maps = locate_binary("psstatic", child.pid)  # a chroot's maps show host paths
        assert os.path.samefile(from_maps, located)
        in_root = locate_binary("psfoo", child.pid)  # from the ld.so.cache of its root
        assert str(in_root) == f"/proc/{child.pid}/root/lib1/libpsfoo.so.1"
        function = SymbolTable.for_path(located).lookup("ps_add")
        with tracing.uprobe(located, function.offset) as probe:
            output, _ = child.communicate("go\n", timeout=60)
            assert child.returncode == 0, output
            assert probe.hits(child.pid) == 5
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[Path]:
    """An overlayfs mount whose lower layer holds the demo program (container-style files)."""
    layers = {name: tmp_path / name for name in ("lower", "upper", "work", "merged")}
    for directory in layers.values():
        directory.mkdir()
    shutil.copy2(programs.demo(pie=True, optimize="-O2"), layers["lower"] / "psdemo")
    options = ",".join(f"{n}dir={layers[n]}" for n in ("lower", "upper", "work"))
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(layers["merged"])],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount overlayfs: {mounted.stderr.strip()}")
    try:
        yield layers["merged"] / "psdemo"
    finally:
        subprocess.run(["umount", str(layers["merged"])], check=True)


def test_program_on_overlayfs(overlay: Path, tracing: Tracing) -> None:
    from probescope.symbols.maps import runtime_address

    function = SymbolTable.for_path(overlay).lookup("ps_add")
    child = subprocess.Popen(
        [str(overlay), "1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PS_SHOW_ADDRESS": "1"},
    )
    try:
        assert child.stdout is not None
        printed = int(child.stdout.readline(), 16)
        assert runtime_address(child.pid, overlay, function.offset) == printed
    finally:
        child.kill()
        child.wait()
    with tracing.uprobe(overlay, function.offset) as probe:
        pid = _run(overlay, "3")
        assert probe.hits(pid) == 3


def test_library_deleted_under_a_running_process(tmp_path: Path, tracing: Tracing) -> None:
    """After an upgrade replaced a library, the process still runs the old, deleted inode:
    locate_binary hands out /proc/PID/map_files/..., which the kernel follows."""
    copy = tmp_path / "libpsgone.so"
    shutil.copyfile(programs.versioned_library(), copy)
    script = (
        "import ctypes, sys\n"
        f"library = ctypes.CDLL({str(copy)!r})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "print(sum(library.ps_lib_func(i) for i in range(3)), flush=True)\n"
    )
    child = subprocess.Popen(
        ["/usr/bin/python3.11", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        copy.unlink()
        located = locate_binary("psgone", child.pid)
        assert "/map_files/" in str(located)
        function = SymbolTable.for_path(located).lookup("ps_lib_func")
        with tracing.uprobe(located, function.offset) as probe:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "21\n"
            assert probe.hits(child.pid) == 3
    finally:
        child.kill()
        child.wait()


def test_leftovers_are_empty_at_the_end() -> None:
    assert [line for line in leftovers() if "symtest" in line] == []
