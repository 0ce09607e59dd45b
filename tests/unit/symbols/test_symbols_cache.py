"""The on-disk symbol cache: hits, invalidation by identity and debug files, corruption, races."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probescope.symbols import cache
from probescope.symbols.identity import file_identity
from probescope.symbols.table import SymbolTable, clear_memory_cache
from unit.symbols import symbol_programs as programs

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def _fresh(path: Path | str, **kwargs) -> SymbolTable:  # type: ignore[no-untyped-def]
    """A table as a new process would get it: nothing in memory, whatever is on disk."""
    clear_memory_cache()
    return SymbolTable.for_path(path, **kwargs)


def test_second_resolution_comes_from_disk(private_symbol_cache: Path) -> None:
    first = _fresh(LIBC)
    assert not first.from_cache
    assert len(list(private_symbol_cache.glob("*.symtab"))) == 1
    second = _fresh(LIBC)
    assert second.from_cache
    assert second.functions == first.functions
    assert second.loads == first.loads
    assert (second.build_id, second.sources, second.debug_file) == (
        first.build_id,
        first.sources,
        first.debug_file,
    )
    assert second.lookup("malloc") == first.lookup("malloc")


def test_memory_cache_returns_the_same_table() -> None:
    first = SymbolTable.for_path(LIBC)
    assert SymbolTable.for_path(LIBC) is first


def test_other_path_to_the_same_file_shares_the_entry(tmp_path: Path) -> None:
    link = tmp_path / "libc-link.so"
    link.symlink_to(LIBC)
    first = _fresh(LIBC)
    second = SymbolTable.for_path(link)
    assert second.path == str(link)
    assert second.functions is first.functions


def test_modified_binary_is_rebuilt(tmp_path: Path) -> None:
    binary = tmp_path / "demo"
    shutil.copyfile(programs.demo(), binary)
    assert not _fresh(binary).from_cache
    assert _fresh(binary).from_cache
    stat = binary.stat()
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    rebuilt = _fresh(binary)
    assert not rebuilt.from_cache
    assert rebuilt.identity == file_identity(binary)
    assert _fresh(binary).from_cache


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: b"",
        lambda blob: blob[: len(blob) // 2],
        lambda blob: blob[:20] + bytes(len(blob) - 20),
        lambda blob: b"PSSYMTAB" + os.urandom(200),
        lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]),
    ],
    ids=["empty", "truncated", "zeroed", "garbage", "bitflip"],
)
def test_corrupt_entries_are_rebuilt(private_symbol_cache: Path, damage) -> None:  # type: ignore[no-untyped-def]
    binary = programs.demo()
    good = _fresh(binary)
    (entry,) = private_symbol_cache.glob("*.symtab")
    entry.write_bytes(damage(entry.read_bytes()))
    rebuilt = _fresh(binary)
    assert not rebuilt.from_cache
    assert rebuilt.functions == good.functions
    assert _fresh(binary).from_cache  # and the entry was repaired


def test_debug_file_installed_later_invalidates(tmp_path: Path) -> None:
    binary, debug_file = programs.stripped_with_build_id()
    root = tmp_path / "debug"
    root.mkdir()
    stripped = SymbolTable.for_path(binary, debug_dirs=[str(root)])
    assert stripped.stripped
    assert _fresh(binary, debug_dirs=[str(root)]).from_cache
    programs.build_id_tree(root, binary, debug_file)
    in_memory = SymbolTable.for_path(binary, debug_dirs=[str(root)])  # memo sees it too
    assert in_memory.sources == ("build-id",)
    from_disk = _fresh(binary, debug_dirs=[str(root)])
    assert from_disk.from_cache and from_disk.sources == ("build-id",)


def test_different_debug_dirs_are_cached_separately(tmp_path: Path) -> None:
    binary, debug_file = programs.stripped_with_build_id()
    root = programs.build_id_tree(tmp_path / "debug", binary, debug_file)
    assert _fresh(binary, debug_dirs=[str(root)]).sources == ("build-id",)
    assert _fresh(binary, debug_dirs=[str(tmp_path / "empty")]).stripped


def test_unwritable_cache_directory_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PROBESCOPE_CACHE_DIR", str(blocker / "cache"))
    table = _fresh(programs.demo())
    assert table.lookup("ps_add")
    assert not _fresh(programs.demo()).from_cache


def test_use_cache_false_touches_nothing(private_symbol_cache: Path) -> None:
    table = SymbolTable.for_path(programs.demo(), use_cache=False)
    assert table.functions
    assert not private_symbol_cache.exists()


def test_concurrent_writers_leave_one_valid_entry(private_symbol_cache: Path) -> None:
    """Eight processes build the same tables at once; every result and the final file agree."""
    script = (
        "import sys\n"
        "from probescope.symbols.table import SymbolTable\n"
        "for _ in range(3):\n"
        "    t = SymbolTable.for_path(sys.argv[1])\n"
        "print(len(t.functions), t.lookup('malloc').offset)\n"
    )
    env = dict(os.environ, PROBESCOPE_CACHE_DIR=str(private_symbol_cache))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, LIBC], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(8)
    ]
    outputs = {w.communicate(timeout=120)[0] for w in workers}
    assert all(w.returncode == 0 for w in workers)
    expected = SymbolTable.for_path(LIBC, use_cache=False)
    assert outputs == {f"{len(expected.functions)} {expected.lookup('malloc').offset}\n"}
    assert [p.name for p in private_symbol_cache.iterdir() if p.name.startswith(".")] == []
    assert _fresh(LIBC).from_cache


def test_clear_removes_entries(private_symbol_cache: Path) -> None:
    _fresh(programs.demo())
    assert cache.clear() == 1
    assert list(private_symbol_cache.iterdir()) == []


def test_prune_keeps_the_newest(
    private_symbol_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache, "MAX_ENTRIES", 4)
    private_symbol_cache.mkdir()
    for number in range(6):
        stale = private_symbol_cache / f"0-{number}-0.symtab"
        stale.write_bytes(b"x")
        os.utime(stale, (1000 + number, 1000 + number))
    _fresh(programs.demo())
    left = sorted(p.name for p in private_symbol_cache.iterdir())
    assert len(left) <= 4
    assert "0-0-0.symtab" not in left
    assert any(not name.startswith("0-") for name in left)  # the new entry survives


def test_the_owning_package_is_asked_once_and_kept_on_disk(
    private_symbol_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from probescope.symbols import debuginfo

    asked: list[str] = []
    real = debuginfo.owning_package

    def counting(path: str) -> debuginfo.Package | None:
        asked.append(path)
        return real(path)

    monkeypatch.setattr(debuginfo, "owning_package", counting)
    first = _fresh("/bin/bash")
    assert first.stripped, "Debian's bash ships without .symtab"
    hint = first.debug_info_hint()
    assert "bash-dbgsym" in hint and asked == ["/bin/bash"]
    assert first.debug_info_hint() == hint and len(asked) == 1
    again = _fresh("/bin/bash")
    assert again.from_cache
    assert again.debug_info_hint() == hint and len(asked) == 1
