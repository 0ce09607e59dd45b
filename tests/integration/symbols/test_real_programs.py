"""Programs nobody here wrote, probed as a new user would: nginx's master and workers, C++ and
Rust functions by their demangled names, on both engines, events counted."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from probescope.events import Event
from probescope.session import Session
from support.tracefs import leftovers
from unit.symbols import language_programs as programs

pytestmark = pytest.mark.root

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_CONF = """
daemon off;
master_process on;
worker_processes 2;
error_log {prefix}/error.log;
pid {prefix}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{ listen 127.0.0.1:{port}; location / {{ return 200 "hello\\n"; }} }}
}}
"""


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = set(leftovers())
    yield
    assert [line for line in set(leftovers()) - before if str(os.getpid()) in line] == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """nginx with two workers on a free loopback port, in a temp prefix: (master pid, port)."""
    if not os.path.exists(NGINX):
        pytest.skip("nginx is not installed (Debian package nginx)")
    port = _free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=tmp_path, port=port))
    master = subprocess.Popen(
        [NGINX, "-p", str(tmp_path), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not _serves(port):
            if master.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"nginx did not start: {master.stderr.read().decode()[-300:]}")  # type: ignore[union-attr]
            time.sleep(0.05)
        yield master.pid, port
    finally:
        master.send_signal(signal.SIGTERM)
        try:
            master.wait(timeout=10)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()


def _serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as response:
            return bool(response.read() == b"hello\n")
    except OSError:
        return False


def _requests(port: int, count: int, delay: float = 0.2) -> threading.Thread:
    """`count` GET requests from a thread, starting after `delay`."""

    def run() -> None:
        time.sleep(delay)
        for _ in range(count):
            _serves(port)
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _collect(
    session: Session,
    seconds: float,
    count: int | None = None,
    requests: tuple[int, int] | None = None,
) -> list[Event]:
    """The session's events; `requests` = (port, n): n requests sent once it is attached."""
    with session:
        thread = _requests(*requests) if requests else None
        events = list(session.events(duration=seconds, count=count))
    if thread is not None:
        thread.join()
    return events


def test_nginx_master_alone_names_its_workers(nginx: tuple[int, int]) -> None:
    master, port = nginx
    session = Session([f"{NGINX}:ngx_http_process_request"], engine="ptrace", pids=[master])
    (note,) = session.notes
    assert f"process {master} (nginx) already has 2 child processes" in note
    assert "--children" in note
    assert session.target.pids == (master,)
    assert _collect(session, 2.5, requests=(port, 3)) == []  # the master serves no request


@pytest.mark.parametrize("engine", ["ptrace", "tracefs"])
def test_nginx_with_its_children(nginx: tuple[int, int], engine: str) -> None:
    master, port = nginx
    session = Session(
        [f"{NGINX}:ngx_http_process_request"],
        engine=engine,
        pids=[master],
        existing_children=True,
    )
    assert session.notes == [] and len(session.target.pids) == 3
    workers = set(session.target.pids) - {master}
    events = _collect(session, 10, count=4, requests=(port, 5))
    assert len(events) == 4
    assert {e.pid for e in events} <= workers and {e.comm for e in events} == {"nginx"}


@pytest.mark.parametrize("engine", ["tracefs", "ptrace"])
def test_cpp_functions_traced_by_demangled_name(engine: str) -> None:
    binary = programs.cpp()
    session = Session(
        [
            f"{binary}:ns::Class::method(int) x=arg2:s32",
            f"r:{binary}:ns::Class::method(double) ret=retval:s32",
            f"{binary}:ns::add*",
            f"{binary}:ns::Class::operator+=(int)",
        ],
        engine=engine,
        command=[str(binary), "3"],
    )
    events = _collect(session, 30)
    names = [e.name for e in events]
    assert names.count("ns_Class_method") == 3
    assert [e.arg("x") for e in events if e.name == "ns_Class_method"] == [0, 1, 2]
    assert [e.arg("ret") for e in events if e.name == "ns_Class_method__return"] == [
        4,
        5,
        6,
    ]  # base argc=2, +1 a round
    assert names.count("ns_add_int") == names.count("ns_add_long") == 3
    assert names.count("ns_Class_operator") == 3


@pytest.mark.parametrize("mangling", ["legacy", "v0"])
@pytest.mark.parametrize("engine", ["tracefs", "ptrace"])
def test_rust_functions_traced_by_demangled_name(mangling: str, engine: str) -> None:
    binary = programs.rust(mangling)
    crate = f"rust_{mangling}"
    session = Session(
        [
            f"{binary}:{crate}::add a=arg1:s64",
            f"{binary}:<{crate}::shapes::Square as {crate}::shapes::Area>::area",
            f"{binary}:{crate}::shapes::*",
        ],
        engine=engine,
        command=[str(binary), "3"],
    )
    events = _collect(session, 30)
    adds = [e for e in events if e.name == f"{crate}_add"]
    assert [e.arg("a") for e in adds] == [0, 1, 2]
    areas = [e for e in events if e.name.endswith("Area_area")]
    assert len(areas) >= 6  # the named probe and the glob's, two squares a round


@pytest.mark.parametrize("engine", ["tracefs", "ptrace"])
def test_go_arguments_in_gos_register_abi(engine: str) -> None:
    binary = programs.go()
    session = Session(
        [
            f"{binary}:main.Add a=arg1:s64 b=arg2:s64",
            f"{binary}:main.Greet name=+0(arg1):char[6] len=arg2:u64 times=arg3:s64",
        ],
        engine=engine,
        command=[str(binary), "3"],
    )
    events = _collect(session, 30)
    assert [(e.arg("a"), e.arg("b")) for e in events if e.name == "main_Add"] == [
        (0, 7),
        (1, 7),
        (2, 7),
    ]
    greets = [e for e in events if e.name == "main_Greet"]
    assert [(e.arg("len"), e.arg("times")) for e in greets] == [(6, 0), (6, 1), (6, 2)]
    name = greets[0].arg("name")  # chars (issue 16 item 8: the ptrace engine's are numbers)
    assert bytes(c if isinstance(c, int) else ord(c) for c in name) == b"gopher"
