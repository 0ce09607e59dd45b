"""The ptrace engine needs no privilege to trace one's own processes: run the tracer as an
ordinary user (created for the test when root), on a program it starts and on one it attaches
to; and see it refused, with a reason, on someone else's process."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from probescope.system import procfs
from support.processes import text_differences

USER = "probescope-test"
DRIVER = Path(__file__).with_name("tracer_driver.py")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    if os.geteuid() != 0:
        pytest.skip(f"needs root to create the test user {USER!r}")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
        check=True,
    )
    return pwd.getpwnam(USER)


@pytest.fixture
def workdir(user: pwd.struct_passwd) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="probescope-ptrace-"))
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as_user(user: pwd.struct_passwd, argv: list[str], **kwargs: object) -> subprocess.Popen:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the test user")
    scope = procfs.ptrace_scope()
    if scope is not None and scope >= 2:
        pytest.skip(f"kernel.yama.ptrace_scope={scope} forbids unprivileged ptrace")
    command = [
        "setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
        *argv,
    ]
    return subprocess.Popen(command, env={"PATH": "/usr/bin:/bin", "HOME": "/"}, **kwargs)  # type: ignore[call-overload]


def _copy(binary: Path, workdir: Path) -> Path:
    copy = workdir / binary.name
    shutil.copy(binary, copy)
    copy.chmod(0o755)
    return copy


def test_trace_a_started_command_as_an_ordinary_user(target, user, workdir):
    program = _copy(target("slow.c"), workdir)
    output = workdir / "out.txt"
    driver = _as_user(
        user,
        [sys.executable, str(DRIVER), str(program), "step", str(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "attached"
    assert [line.split()[2] for line in lines[1:-1]] == [str(i) for i in range(200)]
    assert lines[-1] == "finished exit=0"
    assert output.read_text() == f"done sum={sum(i * 3 + 1 for i in range(200))}\n"


def test_attach_to_own_process_as_an_ordinary_user(target, user, workdir):
    program = _copy(target("spin.c"), workdir)
    spinner = _as_user(user, [str(program)], stdout=subprocess.PIPE)
    try:
        spinner.stdout.readline()
        driver = _as_user(
            user,
            [sys.executable, str(DRIVER), str(program), "tick", "-", "--pid", str(spinner.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert driver.stdout.readline() == "attached\n", driver.stderr.read()
        for _ in range(3):
            assert driver.stdout.readline().startswith("event ")
        driver.terminate()
        _out, err = driver.communicate(timeout=10)
        assert driver.returncode == 0, err
        assert text_differences(spinner.pid, program) == []
        line = spinner.stdout.readline().split()
        assert int(line[2]) == 7 * int(line[1])
    finally:
        spinner.kill()
        spinner.wait()


def test_attaching_to_another_users_process_is_refused_with_a_reason(target, user, workdir):
    program = _copy(target("spin.c"), workdir)
    root_spinner = subprocess.Popen([str(program)], stdout=subprocess.PIPE)
    try:
        root_spinner.stdout.readline()
        driver = _as_user(
            user,
            [
                sys.executable,
                str(DRIVER),
                str(program),
                "tick",
                "-",
                "--pid",
                str(root_spinner.pid),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        _out, err = driver.communicate(timeout=30)
        assert driver.returncode != 0
        assert f"cannot attach to process {root_spinner.pid}" in err
        assert "EPERM" in err
        assert root_spinner.poll() is None
    finally:
        root_spinner.kill()
        root_spinner.wait()
