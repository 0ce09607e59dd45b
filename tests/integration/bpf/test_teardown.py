"""Teardown of the bpf engine: everything it installs is owned by file descriptors, so a
SIGKILLed session leaves nothing — no breakpoint in the traced program's text, no link — with
no reaper; and detaching a thousand probes takes well under a second."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from probescope.engines.base import Target
from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import Command
from probescope.engines.bpf.engine import BpfEngine
from probescope.errors import BpfError
from probescope.events import Event
from probescope.symbols.resolve import resolve_specs
from probescope.symbols.table import SymbolTable

pytestmark = pytest.mark.root

_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def no_stray_processes() -> Iterator[None]:
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def start(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, **kw)  # type: ignore[call-overload]
    _started.append(proc)
    return proc  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def ticker(build: Callable[..., Path]) -> Path:
    source = (Path(__file__).parents[2] / "targets" / "ticker.c").read_text()
    return build(source, "ticker", ("-O0", "-g"))


def text_bytes(pid: int, path: Path, offset: int, size: int = 8) -> tuple[bytes, bytes]:
    """(the bytes at file `offset` as the process sees them, the file's own bytes)."""
    table = SymbolTable.for_path(path)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path) and "x" in fields[1]:
            start, _ = (int(x, 16) for x in fields[0].split("-"))
            file_start = int(fields[2], 16)
            if file_start <= offset:
                address = start + offset - file_start
                break
    else:
        raise AssertionError(f"{path} is not mapped executable in {pid}")
    with open(f"/proc/{pid}/mem", "rb") as memory:
        memory.seek(address)
        live = memory.read(size)
    with open(path, "rb") as binary:
        binary.seek(offset)
        del table
        return live, binary.read(size)


def link_ids(pid: int) -> list[int]:
    """The ids of the BPF links process `pid` holds (from /proc/PID/fdinfo)."""
    ids = []
    for entry in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{entry}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("link_id:"):
                ids.append(int(line.split()[1]))
    return ids


def link_exists(link_id: int) -> bool:
    attr = syscall.Attr()
    attr.u32(0, link_id)
    try:
        fd = syscall.bpf(Command.LINK_GET_FD_BY_ID, attr, "looking up a link")
    except BpfError as error:
        assert error.errno == errno.ENOENT, error.message
        return False
    syscall.close(fd)
    return True


def test_sigkilled_session_leaves_no_breakpoint_and_no_link(ticker: Path) -> None:
    program = start([str(ticker), "-1", "1000"], stdout=subprocess.PIPE)
    offset = SymbolTable.for_path(ticker).lookup("tick").offset
    session = start(
        [
            *(sys.executable, "-m", "probescope", "trace", "--engine", "bpf"),
            *("-p", str(program.pid), f"{ticker}:tick i=arg1:s64", f"r:{ticker}:tick"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert session.stdout is not None
    first = session.stdout.readline().decode()
    assert "tick: (0x" in first, first + session.stderr.read().decode()  # type: ignore[union-attr]
    live, on_disk = text_bytes(program.pid, ticker, offset)
    assert live != on_disk, "a breakpoint is in place while the session runs"
    links = link_ids(session.pid)
    assert len(links) >= 2 and all(link_exists(i) for i in links)

    session.send_signal(signal.SIGKILL)
    session.wait(timeout=30)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        live, on_disk = text_bytes(program.pid, ticker, offset)
        if live == on_disk and not any(link_exists(i) for i in links):
            break
        time.sleep(0.02)
    assert live == on_disk, "every breakpoint is gone after the SIGKILL"
    assert not any(link_exists(i) for i in links)
    assert program.poll() is None, "the traced program runs on undisturbed"
    program.send_signal(signal.SIGTERM)
    out, _ = program.communicate(timeout=30)
    assert program.returncode == 0 and out.startswith(b"ticks ")


def many_functions(count: int) -> str:
    lines = [
        f"__attribute__((noinline)) long fn_{i}(long x) {{ return x + {i}; }}" for i in range(count)
    ]
    calls = " + ".join(f"fn_{i}(n)" for i in range(0, count, 97))
    lines.append(
        "int main(int argc, char **argv) { long n = argc; "
        f"for (int i = 0; i < 3; i++) n += {calls}; return (int)(n & 1); }}"
    )
    return "\n".join(lines)


def test_a_thousand_probes_detach_in_well_under_a_second(build: Callable[..., Path]) -> None:
    binary = build(many_functions(1000), "thousand", ("-O1",))
    probes = resolve_specs([f"{binary}:fn_*"])
    assert len(probes) == 1000
    program = start([str(binary)])
    program.wait(timeout=30)
    sleeper = start(["sleep", "30"])
    engine = BpfEngine()
    began = time.monotonic()
    engine.attach(probes, Target(pids=(sleeper.pid,)))
    attached = time.monotonic() - began
    began = time.monotonic()
    engine.detach()
    detached = time.monotonic() - began
    assert attached < 2.0, f"attach took {attached:.3f}s"
    assert detached < 0.5, f"detach took {detached:.3f}s"


def test_everything_closed_after_detach(ticker: Path) -> None:
    before = set(os.listdir("/proc/self/fd"))
    engine = BpfEngine()
    probes = resolve_specs([f"{ticker}:tick x=+0(%sp):x64 s=+0(%sp):string"])
    engine.attach(probes, Target(command=(str(ticker), "3", "1000")))
    hits = sum(len(item) for item in engine.events() if not isinstance(item, Event))
    engine.detach()
    assert hits == 3
    assert set(os.listdir("/proc/self/fd")) <= before
