"""The test VM harness itself: booting, running commands, tracefs in the guest, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support.build import CACHE as BUILD_CACHE
from vm.guest import (
    LOCKUP_SECONDS,
    SCRATCH_PREFIX,
    GuestKernel,
    qemu_processes,
    reap_stale_scratch,
)
from vm.guest_errors import GuestBootError, GuestKernelHang, GuestTimeout

pytestmark = pytest.mark.vm

GROUP = f"probescope_vm_{os.getpid()}"


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (an orphan's zombie may linger unreaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_gone(guest_pid: int | None, scratch: Path | None) -> None:
    assert guest_pid is not None and scratch is not None
    assert not running(guest_pid), f"QEMU {guest_pid} still running"
    assert qemu_processes(scratch) == []
    assert not scratch.exists(), f"scratch directory {scratch} left behind"


def test_boots_the_debian_6_1_kernel(guest_kernel: GuestKernel) -> None:
    result = guest_kernel.run("uname -r")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == guest_kernel.release
    assert result.stdout.startswith("6.1.")
    assert guest_kernel.kernel.release == guest_kernel.release
    assert guest_kernel.accel in ("kvm", "tcg")
    assert os.uname().release != guest_kernel.release


def test_exit_codes_and_streams_come_back_separately(guest_kernel: GuestKernel) -> None:
    result = guest_kernel.run("echo to-out; echo to-err >&2; exit 42")
    assert (result.stdout, result.stderr, result.returncode) == ("to-out\n", "to-err\n", 42)
    assert guest_kernel.run("false").returncode == 1
    assert guest_kernel.run(["sh", "-c", 'kill -TERM "$$"']).returncode == 128 + signal.SIGTERM


def test_argv_commands_are_quoted_and_env_and_cwd_apply(guest_kernel: GuestKernel) -> None:
    result = guest_kernel.run(
        ["printf", "%s|", "a b", "$HOME", "it's", "$VALUE"],
        env={"VALUE": "not expanded"},
    )
    assert result.stdout == "a b|$HOME|it's|$VALUE|"
    result = guest_kernel.run('echo "$VALUE"; pwd; id -u', cwd="/usr/lib", env={"VALUE": "x y"})
    assert result.stdout.split("\n")[:3] == ["x y", "/usr/lib", "0"]
    missing = guest_kernel.run("true", cwd="/no/such/dir")
    assert missing.returncode == 125


def test_console_log_shows_kernel_messages_of_the_command(guest_kernel: GuestKernel) -> None:
    result = guest_kernel.run("echo '<4>probescope-console-check' > /dev/kmsg")
    assert result.returncode == 0, result.stderr
    assert "probescope-console-check" in result.console_log


def test_host_root_is_read_only_and_scratch_places_are_writable(
    guest_kernel: GuestKernel,
) -> None:
    marker = guest_kernel.shared_dir / "from-host"
    marker.write_text("hello guest\n")
    in_build_cache = BUILD_CACHE / f"probescope-vm-check-{os.getpid()}"
    script = f"""
        cat {marker}
        touch /usr/probescope-must-fail 2>/dev/null && echo host-root-writable
        for d in /tmp /var/tmp /run /dev/shm; do touch $d/x && echo $d ok; done
        echo back > {guest_kernel.shared_dir}/from-guest
        echo built > {in_build_cache}
    """
    try:
        result = guest_kernel.run(textwrap.dedent(script))
        assert result.stdout.split("\n") == [
            "hello guest",
            "/tmp ok",
            "/var/tmp ok",
            "/run ok",
            "/dev/shm ok",
            "",
        ], result.stderr
        assert (guest_kernel.shared_dir / "from-guest").read_text() == "back\n"
        assert in_build_cache.read_text() == "built\n"
    finally:
        in_build_cache.unlink(missing_ok=True)


def test_gcc_and_python_work_in_the_guest(guest_kernel: GuestKernel) -> None:
    script = """
        set -e
        cd /tmp
        printf '#include <stdio.h>\\nint main(void){puts("compiled in guest");return 0;}\\n' > t.c
        gcc -O0 -o t t.c
        ./t
        python3 -c 'import os; print(os.uname().release)'
    """
    result = guest_kernel.run(textwrap.dedent(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["compiled in guest", guest_kernel.release]


def test_kprobe_on_do_sys_openat2_can_be_defined_used_and_removed(
    guest_kernel: GuestKernel,
) -> None:
    tracing = "/sys/kernel/tracing"
    script = f"""
        set -e
        cd {tracing}
        test -e kprobe_events
        echo 'p:{GROUP}/openat do_sys_openat2 dfd=$arg1:s32' >> kprobe_events
        grep -F '{GROUP}/openat' kprobe_events
        echo > trace
        echo 1 > events/{GROUP}/openat/enable
        cat /etc/hostname > /dev/null
        echo 0 > events/{GROUP}/openat/enable
        grep -c 'openat: (do_sys_openat2' trace
        echo '-:{GROUP}/openat' >> kprobe_events
        echo left: $(grep -c '{GROUP}' kprobe_events || true)
    """
    result = guest_kernel.run(textwrap.dedent(script))
    assert result.returncode == 0, result.stderr + result.console_log
    lines = result.stdout.split("\n")
    assert lines[0] == f"p:{GROUP}/openat do_sys_openat2 dfd=$arg1:s32"
    assert int(lines[1]) >= 1
    assert lines[2] == "left: 0"


def test_function_tracer_can_be_enabled_and_disabled(guest_kernel: GuestKernel) -> None:
    script = """
        set -e
        cd /sys/kernel/tracing
        echo do_sys_openat2 > set_ftrace_filter
        echo function > current_tracer
        cat current_tracer
        cat /etc/hostname > /dev/null
        grep -c 'do_sys_openat2 <-' trace
        echo nop > current_tracer
        echo > set_ftrace_filter
        cat current_tracer
    """
    result = guest_kernel.run(textwrap.dedent(script))
    assert result.returncode == 0, result.stderr + result.console_log
    lines = result.stdout.split("\n")
    assert lines[0] == "function"
    assert int(lines[1]) >= 1
    assert lines[2] == "nop"


def test_pytest_runs_inside_the_guest(guest_kernel: GuestKernel) -> None:
    test_file = guest_kernel.shared_dir / "test_tiny_in_guest.py"
    test_file.write_text(
        textwrap.dedent(
            f"""
            import os

            import pytest


            def test_runs_on_guest_kernel():
                assert os.uname().release == {guest_kernel.release!r}
                assert os.environ["PROBESCOPE_GUEST_KERNEL"] == os.uname().release


            def test_is_root_with_tracefs():
                assert os.geteuid() == 0
                assert os.path.exists("/sys/kernel/tracing/kprobe_events")


            def test_fails():
                assert 1 == 2


            @pytest.mark.skip(reason="skipped on purpose")
            def test_skipped():
                pass
            """
        )
    )
    run = guest_kernel.run_pytest([str(test_file)])
    outcomes = {name.rsplit("::", 1)[1]: outcome for name, outcome in run.outcomes().items()}
    assert outcomes == {
        "test_runs_on_guest_kernel": "passed",
        "test_is_root_with_tracefs": "passed",
        "test_fails": "failed",
        "test_skipped": "skipped",
    }, run.report()
    assert run.returncode == 1
    assert "assert 1 == 2" in run.result.stdout


def test_project_tests_import_in_the_guest(guest_kernel: GuestKernel) -> None:
    run = guest_kernel.run_pytest(["--collect-only", "-q", "tests/vm/test_initramfs.py"])
    assert run.returncode == 0, run.report()
    assert "test_initramfs.py::" in run.result.stdout


def test_guest_is_shut_down_after_a_failing_test_body(
    new_guest: Callable[..., GuestKernel],
) -> None:
    guest = new_guest()
    with pytest.raises(RuntimeError, match="test body failed"), guest:
        assert guest.run("exit 3").returncode == 3
        pid, scratch = guest.qemu_pid, guest.scratch
        assert scratch is not None and scratch.is_dir()
        raise RuntimeError("test body failed")
    assert_gone(pid, scratch)
    assert not guest.running


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"memory_mb": 48}, "QEMU exited"),
        ({"boot_timeout": 0.5}, "did not become ready within the boot timeout"),
    ],
    ids=["too-little-memory", "boot-timeout"],
)
def test_a_guest_that_does_not_boot_is_an_error_and_leaves_nothing(
    new_guest: Callable[..., GuestKernel], options: dict[str, float], expected: str
) -> None:
    mine = Path(tempfile.gettempdir()) / f"{SCRATCH_PREFIX}{os.getpid()}-"
    before = set(mine.parent.glob(mine.name + "*"))
    qemus_before = set(qemu_processes(mine))
    guest = new_guest(accel="tcg", **options)
    with pytest.raises(GuestBootError, match=expected) as caught:
        guest.run("true")
    assert "--- console (tail) ---" in str(caught.value)
    assert not guest.running and guest.qemu_pid is None
    assert set(mine.parent.glob(mine.name + "*")) == before
    assert set(qemu_processes(mine)) <= qemus_before


def test_timeout_kills_the_guest_and_the_next_command_boots_a_new_one(
    new_guest: Callable[..., GuestKernel],
) -> None:
    guest = new_guest()
    guest.run("echo started")
    pid, scratch = guest.qemu_pid, guest.scratch
    started = time.monotonic()
    with pytest.raises(GuestTimeout, match="did not finish within 2 s") as caught:
        guest.run("echo partial; sleep 600", timeout=2)
    assert time.monotonic() - started < 30
    assert "partial" in str(caught.value)
    assert_gone(pid, scratch)
    assert guest.run("echo again").stdout == "again\n"
    assert guest.boots == 2 and guest.qemu_pid != pid
    # the guest kernel's watchdog reporting a CPU stuck for minutes ends the command at once
    pid, scratch = guest.qemu_pid, guest.scratch
    started = time.monotonic()
    lockup = f"BUG: soft lockup - CPU#1 stuck for {LOCKUP_SECONDS + 1}s! [python:124]"
    with pytest.raises(GuestKernelHang, match="locked up during command"):
        guest.run(f"echo '<2>watchdog: {lockup}' > /dev/kmsg; sleep 600", timeout=300)
    assert time.monotonic() - started < 60
    assert_gone(pid, scratch)
    guest.close()


_ORPHAN = """
import sys, time
sys.path.insert(0, {tests!r})
from vm.guest import GuestKernel
guest = GuestKernel()
guest.run("true")
print(guest.qemu_pid, guest.scratch, flush=True)
if {how!r} == "garbage-collected":
    guest = None
    print("dropped", flush=True)
elif {how!r} == "exit-without-close":
    sys.exit(0)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["sigkill", "garbage-collected", "exit-without-close"])
def test_guest_dies_with_its_owner(new_guest: Callable[..., GuestKernel], how: str) -> None:
    new_guest()  # skips like guest_kernel when no guest can be had; does not boot
    tests = str(Path(__file__).parents[1])
    child = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN.format(tests=tests, how=how)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tests,
    )
    try:
        assert child.stdout is not None
        pid_text, scratch_text = child.stdout.readline().split()
        pid, scratch = int(pid_text), Path(scratch_text)
        if how == "sigkill":
            child.kill()
            child.wait()
            _wait_until(lambda: not running(pid))
            assert scratch.exists()
            assert scratch in reap_stale_scratch()
        elif how == "garbage-collected":
            assert child.stdout.readline() == "dropped\n"
        else:
            assert child.wait(timeout=30) == 0
        assert_gone(pid, scratch)
    finally:
        child.kill()
        child.wait()


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
