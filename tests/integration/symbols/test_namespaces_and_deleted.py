"""Programs probescope cannot reach by their path in its own view: one in another mount
namespace (`unshare -m` with a tmpfs only it sees), and binaries deleted while they run.

Each is traced by its path with `-p PID` on both engines, and the events are counted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probescope.errors import SpecError
from probescope.session import Session
from probescope.symbols.locate import locate_binary
from probescope.symbols.resolve import resolve_specs
from probescope.system.procfs import process_root, same_mount_namespace
from support.build import compile_program
from support.namespaces import namespaced_ticker, ticker
from support.tracefs import leftovers

pytestmark = pytest.mark.root

TARGETS = Path(__file__).parents[2] / "targets"
LIBRARY_SOURCE = r"""
__attribute__((noinline)) long tickee(long i) { return i * 2; }
"""
USER_SOURCE = r"""
#include <stdio.h>
#include <time.h>
long tickee(long);
int main(void)
{
    struct timespec pause = {0, 2000000L};
    long total = 0;
    for (long i = 0; i < 20000; i++) {
        total += tickee(i);
        nanosleep(&pause, NULL);
    }
    printf("%ld\n", total);
    return 0;
}
"""


def _ticker() -> Path:
    return ticker()


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = set(leftovers())
    yield
    assert [line for line in set(leftovers()) - before if str(os.getpid()) in line] == []


@pytest.fixture
def namespaced(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """The ticker, run from a tmpfs mounted in a private mount namespace only: (pid, path)."""
    with namespaced_ticker(tmp_path) as running:
        yield running


def _events(spec: str, pid: int, engine: str, count: int = 3) -> int:
    session = Session([spec], engine=engine, pids=[pid])
    with session:
        return len(list(session.events(duration=10, count=count)))


def test_process_root_of_another_mount_namespace(namespaced: tuple[int, str]) -> None:
    pid, path = namespaced
    assert not same_mount_namespace(pid)
    assert process_root(pid) == f"/proc/{pid}/root"
    assert process_root(os.getpid()) == ""
    assert str(locate_binary(path, pid)) == f"/proc/{pid}/root{path}"
    with pytest.raises(SpecError, match="no such file"):
        resolve_specs([f"{path}:tick"])


@pytest.mark.parametrize("engine", ["tracefs", "ptrace"])
def test_a_program_in_another_mount_namespace_by_its_path(
    namespaced: tuple[int, str], engine: str
) -> None:
    pid, path = namespaced
    (probe,) = resolve_specs([f"{path}:tick"], pid=pid)
    assert probe.path == f"/proc/{pid}/root{path}"
    assert _events(f"{path}:tick i=arg1:s64", pid, engine) == 3


@pytest.fixture
def deleted(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """The ticker, copied, started and then deleted: (pid, the path it had)."""
    path = tmp_path / "ticker"
    shutil.copy(_ticker(), path)
    process = subprocess.Popen([str(path), "-1", "2000"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        path.unlink()
        yield process.pid, str(path)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("engine", ["tracefs", "ptrace"])
def test_a_deleted_executable_through_its_exe_link(deleted: tuple[int, str], engine: str) -> None:
    pid, path = deleted
    (probe,) = resolve_specs([f"{path}:tick"], pid=pid)
    assert probe.path == f"/proc/{pid}/exe"
    assert _events(f"{path}:tick", pid, engine) == 3


def test_without_a_pid_the_error_names_the_process_running_it(deleted: tuple[int, str]) -> None:
    pid, path = deleted
    with pytest.raises(SpecError) as raised:
        resolve_specs([f"{path}:tick"])
    assert f"give -p {pid}" in (raised.value.hint or "")


def test_a_deleted_library_through_its_map_files_link(tmp_path: Path) -> None:
    library = compile_program(
        LIBRARY_SOURCE, "libtickee.so", ("-O1", "-shared", "-fPIC", "-Wl,-soname,libtickee.so")
    )
    user = compile_program(
        USER_SOURCE,
        "tickee_user",
        ("-O1", "-Wl,--no-as-needed", str(library), "-Wl,-rpath,$ORIGIN"),
    )
    copy = tmp_path / "libtickee.so"
    shutil.copy(library, copy)
    shutil.copy(user, tmp_path / "tickee_user")
    process = subprocess.Popen([str(tmp_path / "tickee_user")], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        copy.unlink()
        (probe,) = resolve_specs([f"{copy}:tickee"], pid=process.pid)
        assert probe.path is not None and probe.path.startswith(f"/proc/{process.pid}/map_files/")
        assert _events(f"{copy}:tickee", process.pid, "tracefs") == 3
    finally:
        process.terminate()
        process.wait(timeout=10)
