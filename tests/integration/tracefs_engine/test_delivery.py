"""Every event delivered, on time (issue 16 items 2 and 3): the live path releases an event as
soon as nothing can precede it; `-d`, `-n`, Ctrl-C and a `-p` target's exit deliver what the
kernel already holds; the summary accounts for every hit the kernel counted."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probescope.session import Session
from support.tracefs import wait_until_armed

pytestmark = pytest.mark.root

RACING_THE_DISABLE = os.cpu_count() or 1
"""Hits the kernel may count and never write, at most one per CPU: a hit in flight when the
stop disables its event passed `nhit++` in uprobe_dispatcher before the flag test that skips
the write (seen on the 6.1 guest, once per stop; never on 6.18 here). The summary names them
"not recorded"."""


def probescope(*args: str, **kw: object) -> subprocess.Popen[str]:
    options: dict[str, object] = {
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    options.update(kw)
    return subprocess.Popen(
        [sys.executable, "-m", "probescope", "trace", "--engine", "tracefs", *args],
        text=True,
        **options,  # type: ignore[call-overload]
    )


def line_within(proc: subprocess.Popen[str], seconds: float) -> str | None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline() if ready else None


def summary_row(stderr: str, event: str) -> list[int]:
    """The numbers of `event`'s row of the summary table."""
    for line in stderr.splitlines():
        if line.startswith(event + " "):
            return [int(word) for word in line.split()[1:]]
    raise AssertionError(f"no summary row for {event}:\n{stderr}")


def test_each_event_shows_while_the_program_still_runs(stepper: Path) -> None:
    """Like `bash:readline`: the event of the line just typed shows before the next line."""
    proc = probescope("-c", str(stepper), f"{stepper}:step n=arg1:s32")
    assert proc.stdin is not None
    try:
        wait_until_armed(proc.pid)  # start-up is not delivery (seconds in the TCG guest)
        for n in range(3):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            line = line_within(proc, 5.0)
            assert line is not None, f"event {n} was held back"
            assert line.rstrip().endswith(f"step: n={n}") or f" n={n}" in line, line
        out, err = proc.communicate(timeout=30)  # closes the program's input: it ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "steps 3" in out and "step:" not in out.replace("steps 3", "")


def test_count_stops_at_the_nth_event(stepper: Path) -> None:
    """`-n 1` ends at the first event, not when a second one (or the program's end) comes."""
    proc = probescope("-n", "1", "-c", str(stepper), f"{stepper}:step")
    assert proc.stdin is not None
    wait_until_armed(proc.pid)  # start-up is not delivery (seconds in the TCG guest)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - started < 5, "waited for an event after the first"
    assert proc.returncode == 0, err
    assert len([line for line in out.splitlines() if "step:" in line]) == 1
    assert "(tracefs engine, 1 events)" in err


@pytest.mark.parametrize(("duration", "count"), [(0.5, None), (None, 3000)])
def test_after_a_stop_every_kernel_hit_is_accounted_for(
    busy: Path, duration: float | None, count: int | None
) -> None:
    session = Session([f"{busy}:work i=arg1:s64"], engine="tracefs", command=[str(busy)])
    shown: list[int] = []

    class Collect:
        def write(self, event: object) -> None: ...

        def write_batch(self, batch: object) -> None:
            shown.extend(e.args[0] for e in batch.events)  # type: ignore[attr-defined]

        def flush(self) -> None: ...

        def close(self) -> None: ...

    summary = session.run([Collect()], duration=duration, count=count)
    assert summary.stats is not None
    kernel = summary.stats.hits["uprobes/work"]
    after = summary.after_stop["uprobes/work"]
    assert summary.hits["uprobes/work"] == len(shown)
    assert shown == list(range(len(shown))), "in order, none missing"
    if count is not None:
        assert len(shown) == count
    assert summary.lost == 0
    unrecorded = summary.unrecorded("uprobes/work")
    assert len(shown) + after + unrecorded == kernel, (len(shown), after, unrecorded, kernel)
    assert unrecorded <= RACING_THE_DISABLE, (len(shown), after, kernel)


def test_ctrl_c_delivers_what_the_kernel_holds_and_accounts_for_the_rest(
    busy: Path, tmp_path: Path
) -> None:
    output = tmp_path / "events.jsonl"
    proc = probescope("-f", "jsonl", "-o", str(output), "-c", str(busy), f"{busy}:work")
    deadline = time.monotonic() + 30
    while (not output.exists() or output.stat().st_size == 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "(tracefs engine, interrupted)" in err
    shown, kernel, *rest = summary_row(err, "uprobes/work")
    after = rest[0] if rest else 0
    assert shown == len(output.read_text().splitlines())
    unrecorded = rest[1] if len(rest) > 1 else 0
    assert shown + after + unrecorded == kernel, err
    assert unrecorded <= RACING_THE_DISABLE, err


def test_a_pid_target_exiting_delivers_its_last_events(busy: Path, stepper: Path) -> None:
    program = subprocess.Popen(
        [str(stepper)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert program.stdin is not None
    proc = probescope("-p", str(program.pid), f"{stepper}:step n=arg1:s32")
    wait_until_armed(proc.pid)
    program.stdin.write("a\nb\nc\n")
    program.stdin.close()
    program.wait(timeout=10)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    values = [re.search(r"n=(\d+)", line) for line in out.splitlines() if "step:" in line]
    assert [int(m.group(1)) for m in values if m] == [0, 1, 2], out + err
    assert summary_row(err, "uprobes/step")[:2] == [3, 3]
