"""Every command as a user who is not root (issue 11 item 1): with tracefs present but closed
to them (mode 0700, as on most distributions), and with tracefs absent and impossible to mount
— `auto` traces with the ptrace engine and says why on one line, `engines` says why tracefs is
not available, the commands that need the kernel exit 1 with a clear sentence, and nothing
ends in a traceback. The tests are root: they drop to user nobody with setpriv."""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from support.build import compile_program

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
LOOP = REPO / "tests" / "targets" / "loop.c"


def _library_path() -> str:
    return os.pathsep.join([str(REPO / "src"), *site.getsitepackages()])


@functools.cache
def _python_for_nobody() -> str | None:
    """An interpreter user nobody can run and that imports probescope and its dependencies
    from this checkout (the virtual environment may point into a directory closed to them)."""
    for candidate in dict.fromkeys([sys.executable, "/usr/bin/python3.11", "/usr/bin/python3"]):
        if not Path(candidate).exists():
            continue
        result = subprocess.run(
            _as_nobody(
                [candidate, "-c", "import probescope.cli.main, rich, elftools, capstone"],
                python_path=_library_path(),
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode == 0:
            return candidate
    return None


def _as_nobody(argv: Sequence[str], *, python_path: str) -> list[str]:
    return [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=-all",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        "HOME=/",
        f"PYTHONPATH={python_path}",
        *argv,
    ]


@pytest.fixture(scope="module")
def python() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to user nobody")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    found = _python_for_nobody()
    if found is None:
        pytest.skip("no Python interpreter that user nobody may run imports this checkout")
    return found


@pytest.fixture(scope="module")
def program() -> Iterator[Path]:
    """The test program where user nobody can run it (the build cache is root's)."""
    directory = Path(tempfile.mkdtemp(prefix="probescope-unprivileged-"))
    directory.chmod(0o755)
    for parent in directory.parents:
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            pytest.skip(f"{parent} is closed to other users")
    copy = directory / "loop"
    shutil.copy(compile_program(LOOP.read_text(), "loop", ("-O1", "-g")), copy)
    copy.chmod(0o755)
    yield copy
    shutil.rmtree(directory, ignore_errors=True)


def probescope(
    python: str, *args: str, hide_tracefs: bool = False
) -> subprocess.CompletedProcess[str]:
    """`probescope ARGS` as user nobody; with `hide_tracefs`, in a mount namespace of its own
    where /sys/kernel is an empty tmpfs: no tracefs, and no mount point to mount one on."""
    argv = _as_nobody([python, "-m", "probescope", *args], python_path=_library_path())
    if hide_tracefs:
        if shutil.which("unshare") is None:
            pytest.skip("unshare (util-linux) is not installed")
        argv = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs none /sys/kernel && exec "$@"', "-"]
        argv += _as_nobody([python, "-m", "probescope", *args], python_path=_library_path())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(params=[False, True], ids=["tracefs-closed", "tracefs-absent"])
def hidden(request: pytest.FixtureRequest) -> bool:
    if not request.param and os.access("/sys/kernel/tracing", os.R_OK, effective_ids=False):
        st = os.stat("/sys/kernel/tracing")
        if st.st_mode & 0o005:
            pytest.skip("tracefs is open to other users on this machine")
    return bool(request.param)


def test_engines_says_why_tracefs_is_not_available(python: str, hidden: bool) -> None:
    result = probescope(python, "engines", hide_tracefs=hidden)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert " no " in rows["tracefs"]
    expected = "not mounted" if hidden else "not root"
    assert expected in result.stdout, result.stdout
    assert " yes " in rows["ptrace"]


def test_auto_traces_with_ptrace_and_says_why_first(
    python: str, program: Path, hidden: bool
) -> None:
    result = probescope(
        python, "trace", "-c", f"{program} 3", f"{program}:func_1 a=arg1:s32", hide_tracefs=hidden
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    notes = [line for line in lines if line.startswith("note: engine auto:")]
    assert len(notes) == 1 and "using ptrace" in notes[0] and "tracefs:" in notes[0], lines
    summary = next(i for i, line in enumerate(lines) if "events in" in line)
    assert lines.index(notes[0]) < summary
    assert "(ptrace engine, end)" in result.stderr
    assert [line.rsplit("=", 1)[1] for line in result.stdout.splitlines() if "func_1:" in line] == [
        "0",
        "1",
        "2",
    ]


@pytest.mark.parametrize(
    ("args", "needs"),
    [
        (["list", "tracepoints"], "listing tracepoints needs the kernel's tracefs"),
        (["list", "functions", "vfs_*"], "listing kernel functions needs the kernel's tracefs"),
        (["list", "kfunctions", "vfs_*"], "listing kernel functions needs the kernel's tracefs"),
        (["cleanup"], "cleaning up tracefs needs the kernel's tracefs"),
        (["cleanup", "--dry-run", "--all"], "cleaning up tracefs needs the kernel's tracefs"),
    ],
)
def test_commands_that_need_the_kernel_say_so(
    python: str, hidden: bool, args: list[str], needs: str
) -> None:
    result = probescope(python, *args, hide_tracefs=hidden)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"error: {needs}, and "), result.stderr
    assert len(result.stderr.splitlines()) == 2 and "\nhint: " in result.stderr


def test_tracing_what_only_the_kernel_can_trace_says_why(python: str, hidden: bool) -> None:
    result = probescope(python, "trace", "-d", "1", "t:sched:sched_switch", hide_tracefs=hidden)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: no engine can run these probes here: ")
    forced = probescope(python, "trace", "--engine", "tracefs", "-d", "1", "t:sched:*")
    assert forced.returncode == 1
    assert forced.stderr.startswith("error: the tracefs engine cannot run here: ")


def test_the_commands_that_need_no_kernel_work(python: str, program: Path, hidden: bool) -> None:
    symbols = probescope(python, "symbols", str(program), "func_*", hide_tracefs=hidden)
    assert symbols.returncode == 0 and "func_1" in symbols.stdout, symbols.stderr
    resolved = probescope(python, "resolve", f"{program}:func_2", hide_tracefs=hidden)
    assert resolved.returncode == 0 and resolved.stdout.startswith("p:uprobes/func_2 ")
    dry = probescope(python, "trace", "--dry-run", f"{program}:func_1", hide_tracefs=hidden)
    assert dry.returncode == 0 and dry.stdout.startswith("p:uprobes/func_1 "), dry.stderr
    usdt = probescope(python, "list", "usdt", str(program), hide_tracefs=hidden)
    assert usdt.returncode in (0, 1) and "USDT" in usdt.stdout + usdt.stderr, usdt.stderr
    for args in (["--version"], ["--help"], ["trace", "--help"], ["list", "--help"]):
        shown = probescope(python, *args, hide_tracefs=hidden)
        assert shown.returncode == 0, (args, shown.stderr)
    recording = program.parent / "writable" / "run.dat"
    recording.parent.mkdir(exist_ok=True)
    os.chown(recording.parent, NOBODY, NOBODY)
    made = probescope(
        python,
        "record",
        "-o",
        str(recording),
        "-c",
        f"{program} 2",
        f"{program}:func_1",
        hide_tracefs=hidden,
    )
    assert made.returncode == 0 and "(ptrace engine" in made.stderr, made.stderr
    report = probescope(python, "report", str(recording), hide_tracefs=hidden)
    assert report.returncode == 0, report.stderr
    assert len([line for line in report.stdout.splitlines() if "func_1:" in line]) == 2
    bad = probescope(python, "trace", f"{program}:nope", "-c", str(program))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")


def test_root_without_a_tracefs_it_can_mount(program: Path) -> None:
    """Root, in a mount namespace where /sys/kernel is an empty tmpfs: mounting tracefs fails
    (no mount point), and every command says so instead of failing."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        script = 'mount -t tmpfs none /sys/kernel && exec "$@"'
        argv = ["unshare", "-m", "sh", "-c", script, "-", sys.executable, "-m", "probescope"]
        result = subprocess.run(
            [*argv, *args], capture_output=True, text=True, timeout=120, cwd="/"
        )
        assert "Traceback" not in result.stderr, result.stderr
        return result

    engines = run("engines")
    tracefs = next(line for line in engines.stdout.splitlines() if line.startswith("tracefs"))
    assert " no " in tracefs and "mounting it failed" in engines.stdout
    listing = run("list", "tracepoints")
    assert listing.returncode == 1
    assert listing.stderr.startswith("error: listing tracepoints needs the kernel's tracefs")
    assert run("cleanup").returncode == 1
    traced = run("trace", "--engine", "tracefs", "-c", str(program), f"{program}:func_1")
    assert traced.returncode == 1 and "the tracefs engine cannot run here" in traced.stderr
    auto = run("trace", "-c", f"{program} 2", f"{program}:func_1")
    assert auto.returncode == 0, auto.stderr
    assert len([line for line in auto.stdout.splitlines() if "func_1:" in line]) == 2
