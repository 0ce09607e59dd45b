"""What /proc says of a process besides its maps, checked against this process and a child."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time

import pytest

from probescope.errors import ProcessError
from probescope.system import procfs

MISSING = 2**22 + 12345


def test_status_comm_threads_of_this_process() -> None:
    pid = os.getpid()
    assert procfs.process_exists(pid) and not procfs.process_exists(MISSING)
    assert procfs.status_fields(pid)["Tgid"] == str(pid)
    assert procfs.thread_group(pid) == pid
    assert procfs.tracer_of(pid) == 0
    with open(f"/proc/{pid}/comm") as comm:
        assert procfs.read_comm(pid) == comm.read().rstrip("\n")
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        tids = procfs.thread_ids(pid)
        assert pid in tids and worker.native_id in tids and tids == sorted(tids)
        assert worker.native_id is not None and procfs.thread_group(worker.native_id) == pid
    finally:
        release.set()
        worker.join()


def test_a_missing_process_reads_as_empty_or_fails_clearly() -> None:
    assert procfs.status_fields(MISSING) == {}
    assert procfs.thread_group(MISSING) is None
    assert procfs.read_comm(MISSING) == procfs.UNKNOWN_COMM
    assert procfs.thread_ids(MISSING) == []
    assert procfs.executable_path(MISSING) is None
    assert procfs.executable_key(MISSING) is None
    assert procfs.environment_variable(MISSING, "PATH") is None
    with pytest.raises(ProcessError, match="auxv"):
        procfs.read_auxv(MISSING)
    with pytest.raises(ProcessError, match="no process"):
        procfs.process_root(MISSING)


def test_auxv_executable_and_root_of_this_process() -> None:
    auxv = procfs.read_auxv(os.getpid())
    assert auxv[procfs.AT_PHNUM] > 0 and auxv[procfs.AT_PHDR] > 0
    assert auxv.get(6) == os.sysconf("SC_PAGE_SIZE")  # AT_PAGESZ
    executable = procfs.executable_path(os.getpid())
    assert executable is not None and os.path.samefile(executable, sys.executable)
    st = os.stat(sys.executable)
    assert procfs.executable_key(os.getpid()) == (st.st_dev, st.st_ino)
    assert procfs.process_root(os.getpid()) == ""


def test_environment_and_stack_limit_of_a_child() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    child = subprocess.Popen(["/bin/sleep", "30"], env={"PATH": "/nowhere:/bin", "OTHER": "x=y"})
    try:
        # Popen returns once exec closed its pipe, a moment before the new image's environment
        # is in place.
        deadline = time.monotonic() + 10
        while procfs.environment_variable(child.pid, "OTHER") is None:
            assert time.monotonic() < deadline, "the child's environment never appeared"
            time.sleep(0.01)
        assert procfs.environment_variable(child.pid, "PATH") == "/nowhere:/bin"
        assert procfs.environment_variable(child.pid, "OTHER") == "x=y"
        assert procfs.environment_variable(child.pid, "HOME") is None
        expected = None if soft == resource.RLIM_INFINITY else soft
        assert procfs.stack_limit(child.pid) == expected
    finally:
        child.kill()
        child.wait()


def test_ptrace_scope_is_what_yama_says() -> None:
    path = "/proc/sys/kernel/yama/ptrace_scope"
    expected = None
    if os.path.exists(path):
        with open(path) as setting:
            expected = int(setting.read())
    assert procfs.ptrace_scope() == expected
