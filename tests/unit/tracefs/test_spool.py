"""The recorder process and its spool, fed by files standing in for `trace_pipe_raw` (the
live kernel path is covered by the tracefs engine tests)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from probescope.engines.tracefs.spool import PageSpool
from probescope.errors import ProbescopeError

SIZE = 64


def page(cpu: int, number: int) -> bytes:
    return f"cpu{cpu} page{number}".encode().ljust(SIZE, b".")


def sources(tmp_path: Path, pages: dict[int, int]) -> dict[int, Path]:
    paths = {}
    for cpu, count in pages.items():
        path = tmp_path / f"cpu{cpu}"
        path.write_bytes(b"".join(page(cpu, n) for n in range(count)))
        paths[cpu] = path
    return paths


def read_all(spool: PageSpool, timeout: float = 10.0) -> list[tuple[int, bytes | None]]:
    items: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + timeout
    spool.finish()
    while not spool.finished:
        assert time.monotonic() < deadline, "the recorder never finished"
        items += spool.drain(limit=4)
        if not spool.more:
            spool.wait(0.01)
    items += spool.drain(limit=4)
    return items


def test_every_sub_buffer_arrives_once_in_order_per_cpu(tmp_path: Path) -> None:
    spool = PageSpool(sources(tmp_path, {0: 300, 1: 7, 3: 0}), SIZE, interval=0.01)
    try:
        spool.start()
        items = read_all(spool)
    finally:
        spool.close()
    for cpu, count in ((0, 300), (1, 7), (3, 0)):
        assert [data for c, data in items if c == cpu and data] == [
            page(cpu, n) for n in range(count)
        ]
    assert spool.pages_read == 307
    assert spool.recorder_status == 0
    # Each CPU is reported caught up after its last sub-buffer.
    for cpu in (0, 1, 3):
        last_page = max((i for i, (c, d) in enumerate(items) if c == cpu and d), default=-1)
        assert any(c == cpu and d is None for c, d in items[last_page + 1 :])


def test_short_reads_are_padded_to_a_sub_buffer(tmp_path: Path) -> None:
    path = tmp_path / "cpu0"
    path.write_bytes(page(0, 0) + b"tail")
    spool = PageSpool({0: path}, SIZE, interval=0.01)
    try:
        spool.start()
        pages = [data for _, data in read_all(spool) if data]
    finally:
        spool.close()
    assert pages == [page(0, 0), b"tail".ljust(SIZE, b"\0")]


def test_close_kills_the_recorder_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    fifo = tmp_path / "cpu0"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # keeps the FIFO open and empty: the recorder waits
    try:
        spool = PageSpool({0: fifo}, SIZE, interval=0.01)
        spool.start()
        pid = spool.recorder_pid
        assert pid is not None
        assert not list(spool_dir.iterdir()), "the spool is never a named file"
        fds_before = set(os.listdir("/proc/self/fd"))
        spool.close()
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        assert not Path(f"/proc/{pid}").exists()
        assert set(os.listdir("/proc/self/fd")) < fds_before
    finally:
        os.close(writer)


def test_a_recorder_that_dies_is_reported(tmp_path: Path) -> None:
    fifo = tmp_path / "cpu0"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)
    spool = PageSpool({0: fifo}, SIZE, interval=0.01)
    try:
        spool.start()
        assert spool.recorder_pid is not None
        os.kill(spool.recorder_pid, 9)
        with pytest.raises(ProbescopeError, match=r"recorder \(pid \d+\) died with status -9"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                spool.wait(0.01)
    finally:
        spool.close()
        os.close(writer)
