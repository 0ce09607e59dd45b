"""Locating targets: paths, commands, library short names, ld.so caches built by ldconfig."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probescope.errors import SymbolError
from probescope.symbols.identity import file_identity
from probescope.symbols.ldcache import _from_ldconfig, parse_ld_cache, read_ld_cache
from probescope.symbols.locate import library_name_matches, locate_binary
from probescope.symbols.maps import mappings_of
from probescope.system.maps import read_maps
from support.build import compile_program
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def _same_file(a: str | Path, b: str | Path) -> bool:
    return file_identity(a).key == file_identity(b).key


def test_paths_are_returned_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    binary = programs.demo()
    monkeypatch.chdir(binary.parent)
    located = locate_binary(f"./{binary.name}")
    assert located == binary and located.is_absolute()


def test_commands_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    assert _same_file(locate_binary("bash"), shutil.which("bash") or "")
    assert _same_file(locate_binary("python3.11"), "/usr/bin/python3.11")


def test_script_commands_are_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "bin" / "bash"
    script.parent.mkdir()
    script.write_text('#!/usr/bin/env sh\nexec /bin/bash "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin")
    with pytest.raises(SymbolError, match="is a script") as error:
        locate_binary("bash")
    hint = error.value.hint or ""
    assert "interpreter is sh" in hint and "/usr/bin/bash" in hint


@pytest.mark.parametrize("name", ["c", "libc", "libc.so.6"])
def test_libc_short_names(name: str) -> None:
    located = locate_binary(name)
    mapped = mappings_of("self", LIBC)
    assert mapped, "the test process maps libc"
    assert _same_file(located, LIBC)


def test_library_name_rules() -> None:
    assert library_name_matches("libc.so.6", "c")
    assert library_name_matches("libc.so.6", "libc")
    assert library_name_matches("libc.so", "c")
    assert library_name_matches("libssl.so.3", "ssl")
    assert library_name_matches("libstdc++.so.6", "stdc++")
    assert not library_name_matches("libcrypt.so.1", "c")
    assert not library_name_matches("libssl3.so", "ssl")
    assert not library_name_matches("libc.so.6", "libc.so")
    assert library_name_matches("libc.so.6", "libc.so.6")


def test_ssl_if_installed() -> None:
    if not Path("/usr/lib/x86_64-linux-gnu/libssl.so.3").exists():
        pytest.skip("libssl3 is not installed")
    assert _same_file(locate_binary("ssl"), "/usr/lib/x86_64-linux-gnu/libssl.so.3")
    assert _same_file(locate_binary("libssl.so.3"), "/usr/lib/x86_64-linux-gnu/libssl.so.3")


@pytest.mark.parametrize(
    "target, message",
    [
        ("/nonexistent/x", "no such file"),
        ("/etc", "is a directory"),
        ("/etc/hostname", "not an ELF file"),
        ("probescope-no-such-thing", "cannot find"),
        ("", "empty target"),
    ],
)
def test_errors(target: str, message: str) -> None:
    with pytest.raises(SymbolError, match=message):
        locate_binary(target)


def test_unknown_library_suggests_close_names() -> None:
    with pytest.raises(SymbolError) as error:
        locate_binary("libssk")
    assert "libssl" in (error.value.hint or "")


def _shared_library(name: str, soname: str) -> Path:
    return compile_program(
        f"int {name.replace('.', '_')}_marker(void) {{ return 1; }}\n",
        soname,
        ["-O2", "-shared", "-fPIC", f"-Wl,-soname,{soname}"],
    )


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A root directory with libpsfoo.so.1 and libpsfoo.so.2 and an ld.so.cache from ldconfig."""
    if shutil.which("ldconfig") is None:
        pytest.skip("ldconfig is not installed")
    root = tmp_path / "root"
    for directory, soname in (("lib1", "libpsfoo.so.1"), ("lib2", "libpsfoo.so.2")):
        (root / directory).mkdir(parents=True)
        shutil.copyfile(_shared_library(soname, soname), root / directory / soname)
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.conf").write_text("/lib1\n/lib2\n")
    subprocess.run(
        ["ldconfig", "-r", str(root), "-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"],
        check=True,
        capture_output=True,
    )
    return root


def test_cache_written_by_ldconfig_parses(fake_root: Path) -> None:
    entries = read_ld_cache(str(fake_root / "etc" / "ld.so.cache"))
    assert {(e.name, e.path) for e in entries} >= {
        ("libpsfoo.so.1", "/lib1/libpsfoo.so.1"),
        ("libpsfoo.so.2", "/lib2/libpsfoo.so.2"),
    }


def test_ambiguous_library_lists_candidates(fake_root: Path) -> None:
    with pytest.raises(SymbolError, match="ambiguous") as error:
        locate_binary("psfoo", root=str(fake_root))
    assert str(fake_root / "lib1" / "libpsfoo.so.1") in error.value.message
    assert str(fake_root / "lib2" / "libpsfoo.so.2") in error.value.message
    exact = locate_binary("libpsfoo.so.2", root=str(fake_root))
    assert exact == fake_root / "lib2" / "libpsfoo.so.2"


def test_system_cache_matches_ldconfig_p() -> None:
    if not Path("/etc/ld.so.cache").exists() or shutil.which("ldconfig") is None:
        pytest.skip("no system ld.so.cache")
    ours = sorted((e.name, e.path) for e in read_ld_cache())
    assert ours == sorted((e.name, e.path) for e in _from_ldconfig())


def test_old_format_cache() -> None:
    strings = b"libold.so.1\0/lib/libold.so.1\0"
    data = b"ld.so-1.7.0\0" + struct.pack("<I", 1) + struct.pack("<iII", 1, 0, 12) + strings
    (entry,) = parse_ld_cache(data) or []
    assert (entry.name, entry.path, entry.flags) == ("libold.so.1", "/lib/libold.so.1", 1)


def test_garbage_cache_is_not_parsed() -> None:
    assert parse_ld_cache(b"not a cache at all") is None
    assert parse_ld_cache(b"glibc-ld.so.cache1.1" + bytes(4)) is None


def test_pid_resolves_to_what_the_process_mapped() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import ssl, sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        for _ in range(200):
            names = {os.path.basename(m.path or "") for m in read_maps(child.pid)}
            if any(n.startswith("libssl") for n in names):
                break
            time.sleep(0.02)
        located = locate_binary("ssl", child.pid)
        assert any(m.path and _same_file(m.path, located) for m in read_maps(child.pid) if m.inode)
        assert _same_file(locate_binary("c", child.pid), LIBC)
        assert _same_file(locate_binary("bash", child.pid), shutil.which("bash") or "")
    finally:
        child.communicate(b"")


def test_missing_pid() -> None:
    with pytest.raises(SymbolError, match="no process"):
        locate_binary("c", pid=2**22 + 12345)


def test_deleted_library_of_a_process_is_reached_through_map_files(tmp_path: Path) -> None:
    copy = tmp_path / "libpsgone.so"
    shutil.copyfile(programs.versioned_library(), copy)
    child = subprocess.Popen(
        [sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL({str(copy)!r}); sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        for _ in range(500):
            if any(m.path == str(copy) for m in read_maps(child.pid)):
                break
            time.sleep(0.01)
        inode = copy.stat().st_ino
        copy.unlink()
        located = locate_binary("psgone", child.pid)
        assert str(located).startswith(f"/proc/{child.pid}/map_files/")
        assert located.stat().st_ino == inode
        from probescope.symbols.table import SymbolTable

        assert SymbolTable.for_path(located).lookup("ps_lib_func").size > 0
    finally:
        child.communicate(b"")
