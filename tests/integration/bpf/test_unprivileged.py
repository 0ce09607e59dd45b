"""The bpf engine for users granted CAP_BPF and CAP_PERFMON instead of root: uprobes through
uprobe_multi links work; what needs tracefs (tracepoints, following new child processes) is
said to be missing, not failed on."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

NOBODY = 65534


def as_nobody_with_bpf_caps(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--inh-caps=+bpf,+perfmon",
            "--ambient-caps=+bpf,+perfmon",
            sys.executable,
            "-m",
            "probescope",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PYTHONPATH": str(Path(__file__).parents[3] / "src"), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def shared_copy(values: Path) -> Iterator[Path]:
    """The test program where user nobody can run it (the build cache and pytest's temporary
    directories are root's alone)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    listed = subprocess.run(["setpriv", "--list-caps"], capture_output=True, text=True).stdout
    if "bpf" not in listed.split() or "perfmon" not in listed.split():
        pytest.skip("this setpriv does not know CAP_BPF and CAP_PERFMON")
    directory = Path(tempfile.mkdtemp(prefix="probescope-unprivileged-"))
    directory.chmod(0o755)
    for parent in directory.parents:
        if parent == Path("/"):
            break
        if not parent.stat().st_mode & 0o001:
            pytest.skip(f"{parent} is closed to other users")
    copy = directory / "values"
    shutil.copy(values, copy)
    copy.chmod(0o755)
    try:
        yield copy
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_engines_and_trace_with_capabilities_only(shared_copy: Path) -> None:
    engines = as_nobody_with_bpf_caps("engines")
    assert engines.returncode == 0, engines.stderr
    bpf_line = next(line for line in engines.stdout.splitlines() if line.startswith("bpf "))
    assert " yes " in bpf_line
    result = as_nobody_with_bpf_caps(
        "trace", "-c", str(shared_copy), f"{shared_copy}:filter_probe n=arg1:s32 w=+0(arg2):string"
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "filter_probe:" in line]
    assert len(lines) == 7 and 'w="alpha"' in lines[0]
    assert "(bpf engine, end); lost 0" in result.stderr
    assert "children are not followed" in result.stderr


def test_without_capabilities_the_reason_is_given(shared_copy: Path) -> None:
    result = subprocess.run(
        [
            *("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"),
            *(sys.executable, "-m", "probescope", "engines"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PYTHONPATH": str(Path(__file__).parents[3] / "src"), "PATH": "/usr/bin:/bin"},
    )
    bpf_line = next(line for line in result.stdout.splitlines() if line.startswith("bpf "))
    assert " no " in bpf_line and "EPERM" in result.stdout
