"""Bad input, everywhere (issue 11 item 7): hypothesis builds argv from the real option set of
every command (read from the parser itself) and from probe-spec fragments — NUL bytes, huge
and negative numbers, non-UTF-8 paths, thousands of specs — and runs `main(argv)` in a forked
copy of this process. It never prints a traceback, never touches kernel state when it exits 2
(the real tracefs writes, instance creation and engine attaches are watched in the child), and
never hangs: a command still running after a few seconds is a live trace, which must then end
cleanly on Ctrl-C. Nothing it creates outlives it.

The child runs with PATH pointing at (and in) an empty directory and with targets (`-p`, `-c`)
drawn from the test's own programs only, so no generated word can start or attach to anything
else nor write anywhere but there; `cleanup` always gets `--dry-run`. PROBESCOPE_FUZZ_EXAMPLES
sets the number of examples.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probescope.cli.main import build_parser, main
from support.build import compile_program
from support.tracefs import owned_by

EXAMPLES = int(os.environ.get("PROBESCOPE_FUZZ_EXAMPLES", "400"))
RUNNING_GRACE = 1.5  # a command still running after this is a live trace: it gets Ctrl-C
STOP_GRACE = 20.0  # and must have ended this long after it
TARGETS = Path(__file__).parents[2] / "targets"
_counter = {"examples": 0, "by_status": {}}


def _program() -> Path:
    return compile_program((TARGETS / "chaos.c").read_text(), "chaos", ("-O1", "-g"))


PROGRAM = _program()
NOT_UTF8 = os.fsdecode(b"/tmp/probescope-\xff\xfe-fuzz")


@pytest.fixture(scope="module")
def sleeper() -> Iterator[int]:
    """A process of the test's own for `-p` to name: it sleeps."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _commands() -> dict[str, dict[str, argparse.Action]]:
    """Every command (list's kinds as `list KIND`) with its options, from the real parser."""
    found: dict[str, dict[str, argparse.Action]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
        options = {
            option: action
            for action in parser._actions
            for option in action.option_strings
            if not isinstance(action, argparse._SubParsersAction)
        }
        if prefix:
            found[prefix] = options

    walk(build_parser(None), "")
    found.pop("list", None)
    return found


COMMANDS = _commands()

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "-1", "1", "0x10", "010", "1e3", "nan", "inf", "-inf", "1.5", ""]),
)
garbage = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=8),
    st.just("\0"),
    st.just(NOT_UTF8),
    st.binary(max_size=8).map(os.fsdecode),
)
paths = st.sampled_from(
    [str(PROGRAM), "/bin/true", "/nonexistent/x", "/tmp", "/dev/null", NOT_UTF8, "", "c", "libc"]
)
symbols = st.sampled_from(
    ["work", "main", "nope", "*", "w*", "0x0", "0x1139", "18446744073709551616"]
)
fetchargs = st.sampled_from(
    [
        "i=arg1:s64",
        "x=+0(arg1):string",
        "%di",
        "%rax",
        "$retval",
        "ret=retval:u65",
        "arg99",
        "+0(%sp):u8[64]",
        '\\"s\\"',
        "if",
        "if i > 2",
        "if i ~ x*",
        "if nope == 1",
        "i",
        ">",
        "0" * 80,
        "a" * 70 + "=%di",
        "\0",
    ]
)


@st.composite
def specs(draw: st.DrawFn) -> str:
    prefix = draw(
        st.sampled_from(["", "r:", "p:", "p:g/e ", "r:g/", "t:", "usdt:", "k:", "-:", "e:"])
    )
    target = draw(st.one_of(paths, garbage))
    shape = draw(st.integers(0, 4))
    if shape == 0:
        return prefix + target
    if shape == 1:
        return draw(garbage)
    if shape == 2:
        return draw(st.sampled_from(["t:sched:sched_switch", "t:sched:*", "t:nope:x", "f:vfs_*"]))
    text = f"{prefix}{target}:{draw(symbols)}"
    for arg in draw(st.lists(fetchargs, max_size=4)):
        text += " " + arg
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(garbage) + text[cut:]
    return text


def _value(dest: str, sleeper: int) -> st.SearchStrategy[str]:
    if dest == "pid":
        return st.one_of(st.sampled_from([str(sleeper), "4194305", "0", "-1", "x"]), numbers)
    if dest == "command":
        return st.sampled_from(
            [f"{PROGRAM} 200", f"{PROGRAM} 200 extra", "/nonexistent/x", "", "'unclosed", "x"]
        )
    if dest == "output":
        return st.sampled_from(
            ["/nonexistent/dir/out", "/proc/version", "/dev/null", NOT_UTF8 + "/out", ""]
        )
    if dest in ("duration", "count", "buffer_size"):
        return numbers
    if dest == "format":
        return st.one_of(st.sampled_from(["text", "jsonl"]), garbage)
    if dest == "engine":
        return st.one_of(st.sampled_from(["auto", "tracefs", "ptrace", "bpf"]), garbage)
    if dest == "clock":
        return st.one_of(st.sampled_from(["mono", "local", "boot", "x86-tsc"]), garbage)
    if dest == "filter":
        return st.one_of(st.sampled_from(["i > 2", "i ~ x", "((", "nope == 1", ""]), garbage)
    if dest == "debug_dir":
        return paths
    return st.one_of(paths, garbage)


@st.composite
def argvs(draw: st.DrawFn, sleeper: int) -> list[str]:
    if draw(st.integers(0, 3)) == 0:  # a trace that can run, and what the options do to it
        command = "trace"
        words = ["trace", "-c", f"{PROGRAM} 200", f"{PROGRAM}:work i=arg1:s64"]
        if draw(st.booleans()):
            words.append(f"r:{PROGRAM}:work ret=retval:s64")
    else:
        command = draw(st.sampled_from(sorted(COMMANDS)))
        words = command.split()
    options = COMMANDS[command]
    for _ in range(draw(st.integers(0, 5))):
        option = draw(st.sampled_from(sorted(options)))
        action = options[option]
        if command == "cleanup" and option == "--all":
            continue  # would remove other sessions' objects for real
        words.append(option)
        if action.nargs != 0:
            words.append(draw(_value(action.dest, sleeper)))
    if command == "trace" and "-c" in words[:2]:
        pass
    elif command in ("trace", "resolve"):
        count = draw(st.integers(0, 4))
        words += [draw(specs()) for _ in range(count)]
    elif command in ("symbols", "list usdt"):
        words += [draw(st.one_of(paths, garbage)) for _ in range(draw(st.integers(0, 2)))]
    elif command.startswith("list"):
        words += [draw(st.one_of(symbols, garbage)) for _ in range(draw(st.integers(0, 2)))]
    if command == "cleanup" and "-n" not in words and "--dry-run" not in words:
        words.append("--dry-run")
    if draw(st.integers(0, 9)) == 0:
        draw_index = draw(st.integers(0, len(words)))
        words.insert(draw_index, draw(garbage))
    return words


def run_main(
    argv: list[str], empty_path: str, grace: float = RUNNING_GRACE
) -> tuple[int | str, str, bool, int]:
    """`main(argv)` in a forked child: (exit status or "hang", stderr, whether it touched the
    kernel, the child's pid)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        touched_r, touched_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 255
            try:
                os.close(touched_r)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdin = open(0, closefd=False)  # noqa: SIM115 (pytest's captures, replaced)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115
                os.environ["PATH"] = empty_path
                os.chdir(empty_path)  # `record` writes trace.dat here by default
                signal.signal(signal.SIGINT, signal.default_int_handler)
                _watch_kernel_writes(touched_w)
                status = main(argv)
            except SystemExit as end:
                status = end.code if isinstance(end.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
                status = 254
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(status)
        os.close(touched_w)
        status = _wait(pid, grace)
        touched = os.read(touched_r, 1) != b""
        os.close(touched_r)
        err.seek(0)
        return status, err.read().decode(errors="replace"), touched, pid


def _watch_kernel_writes(fd: int) -> None:
    """In the child: note (without changing what they do) the calls that change the kernel's
    state or a process — tracefs writes, instance creation, BPF links, ptrace attaches."""
    from probescope.engines.bpf import attachments as bpf_attachments
    from probescope.engines.ptrace.attaching import Attaching
    from probescope.engines.tracefs.instance import Instance
    from probescope.engines.tracefs.tracefs import Tracefs

    def noting(original):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            with contextlib.suppress(OSError):
                os.write(fd, b"t")
            return original(*args, **kwargs)

        return call

    Tracefs._write = noting(Tracefs._write)  # type: ignore[method-assign]
    Instance.create = classmethod(noting(Instance.create.__func__))  # type: ignore[method-assign]
    Attaching.spawn = noting(Attaching.spawn)  # type: ignore[method-assign]
    Attaching.attach = noting(Attaching.attach)  # type: ignore[method-assign]
    bpf_attachments.attach_uprobe_multi = noting(bpf_attachments.attach_uprobe_multi)
    bpf_attachments.attach_to_perf_event = noting(bpf_attachments.attach_to_perf_event)


def _wait(pid: int, grace: float) -> int | str:
    started = time.monotonic()
    interrupted = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        elapsed = time.monotonic() - started
        if not interrupted and elapsed > grace:
            os.kill(pid, signal.SIGINT)  # a live trace: the user's Ctrl-C
            interrupted = True
        elif elapsed > grace + STOP_GRACE:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hang"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def empty_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="probescope-fuzz-path-") as directory:
        yield directory


@pytest.mark.slow
def test_fuzzed_argv_never_tracebacks_hangs_or_touches_the_kernel_on_exit_2(
    sleeper: int, empty_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=argvs(sleeper))
    def check(argv: list[str]) -> None:
        began = time.monotonic()
        status, stderr, touched, pid = run_main(argv, empty_path)
        if os.environ.get("PROBESCOPE_FUZZ_SLOW"):
            with capsys.disabled():
                print(f"{time.monotonic() - began:6.2f}s {status} {argv!r}"[:300])
        _counter["examples"] += 1
        by_status = _counter["by_status"]
        by_status[status] = by_status.get(status, 0) + 1
        assert status != "hang", argv
        assert status != 254 and "Traceback" not in stderr, (argv, stderr)
        assert isinstance(status, int) and status >= 0, (argv, status, stderr)
        if status == 2:
            assert not touched, ("exit 2 after touching the kernel", argv, stderr)
        deadline = time.monotonic() + 2.0
        while owned_by(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert owned_by(pid) == [], argv

    check()
    with capsys.disabled():
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(_counter["by_status"].items()))
        print(f"\nCLI fuzz: {_counter['examples']} argv run (exit statuses {statuses})")


def test_ten_thousand_specs(empty_path: str) -> None:
    specs = [f"{PROGRAM}:work i=arg1:s64"] * 5000 + [f"{PROGRAM}:nope{i}" for i in range(5000)]
    started = time.monotonic()
    argv = ["trace", "-c", f"{PROGRAM} 10", *specs]
    status, stderr, touched, _ = run_main(argv, empty_path, grace=110)
    assert status == 2 and not touched, stderr[-2000:]
    assert stderr.count("error: ") == 5000 and "Traceback" not in stderr
    assert time.monotonic() - started < 120
    status, stderr, touched, _ = run_main(["resolve", *specs[:5000]], empty_path, grace=110)
    assert status == 0 and not touched, stderr[-2000:]
