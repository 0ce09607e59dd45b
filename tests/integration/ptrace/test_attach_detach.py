"""Attaching to running processes, detaching from them, and a tracer killed with SIGTERM:
afterwards the program runs on unharmed, with every byte of its text as in the file."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from integration.ptrace.harness import gated, make_probe, run_plain
from probescope.engines.base import Target
from probescope.engines.ptrace import PtraceEngine
from probescope.events import EventBatch
from support.processes import text_differences, tracer_of

DRIVER = Path(__file__).with_name("tracer_driver.py")


def _anonymous_executable_mappings(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if line.split()[1] == "r-xp" and len(line.split()) == 5]


def test_attach_to_a_running_process_and_detach(target):
    path = target("spin.c")
    probe = make_probe(path, "tick", "i=%di:s64")
    ret = make_probe(path, "tick", "r=$retval:s64", kind="r", event="tick_ret")
    program = subprocess.Popen([path], stdout=subprocess.PIPE)
    try:
        first = program.stdout.readline()
        assert first.startswith(b"tick 0 ")
        before_affinity = os.sched_getaffinity(program.pid)
        before_maps = _anonymous_executable_mappings(program.pid)
        engine = PtraceEngine()
        engine.attach([probe, ret], Target(pids=(program.pid,)))
        assert tracer_of(program.pid) == os.getpid()
        assert text_differences(program.pid, path)  # our int3 is in
        seen = []
        for item in engine.events():
            if isinstance(item, EventBatch):
                continue
            seen.append(item)
            if len(seen) >= 10:
                break  # closing the generator detaches
        assert tracer_of(program.pid) == 0
        assert text_differences(program.pid, path) == []
        assert _anonymous_executable_mappings(program.pid) == before_maps
        assert os.sched_getaffinity(program.pid) == before_affinity
        entries = [e.arg("i") for e in seen if e.name == "tick"]
        returns = [e.arg("r") for e in seen if e.name == "tick_ret"]
        assert entries == list(range(entries[0], entries[0] + len(entries)))
        assert returns == [i * 7 for i in entries[: len(returns)]]
        # It keeps running and counting, unharmed.
        lines = [program.stdout.readline() for _ in range(30)]
        numbers = [int(line.split()[1]) for line in lines]
        assert numbers == list(range(numbers[0], numbers[0] + 30))
        assert all(int(line.split()[2]) == 7 * int(line.split()[1]) for line in lines)
        assert program.poll() is None
    finally:
        program.kill()
        program.wait()


def test_attach_follows_every_thread(target):
    path = target("spin_threads.c", ("-O0", "-g", "-pthread"))
    probe = make_probe(path, "tick", "id=%di:s64")
    program = subprocess.Popen([path], stdout=subprocess.PIPE)
    try:
        assert program.stdout.readline() == b"started\n"
        engine = PtraceEngine()
        engine.attach([probe], Target(pids=(program.pid,)))
        ids: dict[int, set[int]] = {}
        for item in engine.events():
            if isinstance(item, EventBatch):
                continue
            ids.setdefault(item.tid, set()).add(item.arg("id"))
            if (
                len(ids) == 3
                and sum(len(v) for v in ids.values()) >= 3
                and len([1 for _ in ids]) == 3
            ):
                break
        assert sorted(next(iter(v)) for v in ids.values()) == [1, 2, 3]
        assert text_differences(program.pid, path) == []
        time.sleep(0.05)
        assert program.poll() is None
    finally:
        program.kill()
        program.wait()


def test_sigterm_of_the_tracer_restores_everything(target, tmp_path):
    path = target("slow.c")
    output = tmp_path / "out.txt"
    program = gated([path], output)
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), str(path), "step", "-", "--pid", str(program.pid)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout.readline() == "attached\n"
        program.release()
        for _ in range(20):
            assert driver.stdout.readline().startswith("event ")
        driver.send_signal(signal.SIGTERM)
        rest = driver.stdout.read()
        assert driver.wait(10) == 0
        assert "detached" in rest
    finally:
        if driver.poll() is None:
            driver.kill()
    # The program finishes on its own with the right output.
    assert program.wait(10) == 0
    assert output.read_text() == f"done sum={sum(i * 3 + 1 for i in range(200))}\n"


def test_sigterm_while_attached_with_pid(target):
    path = target("spin.c")
    program = subprocess.Popen([path], stdout=subprocess.PIPE)
    try:
        program.stdout.readline()
        driver = subprocess.Popen(
            [sys.executable, str(DRIVER), str(path), "tick", "-", "--pid", str(program.pid)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert driver.stdout.readline() == "attached\n"
        assert driver.stdout.readline().startswith("event 1 ")
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(10) == 0
        assert tracer_of(program.pid) == 0
        assert text_differences(program.pid, path) == []
        lines = [program.stdout.readline() for _ in range(10)]
        assert all(int(line.split()[2]) == 7 * int(line.split()[1]) for line in lines)
    finally:
        program.kill()
        program.wait()


def test_detach_is_idempotent_and_an_attached_process_runs_on(target, tmp_path):
    path = target("slow.c")
    probe = make_probe(path, "step")
    engine = PtraceEngine()
    output = tmp_path / "out.txt"
    program = gated([path], output)
    engine.attach([probe], Target(pids=(program.pid,)))
    program.release()
    events = engine.events()
    first = next(e for e in events if not isinstance(e, EventBatch))
    assert first.name == "step"
    engine.detach()
    engine.detach()
    events.close()
    assert text_differences(program.pid, path) == []
    assert program.wait(10) == 0
    assert output.read_text().startswith("done sum=")


def test_detach_ends_a_command_still_running(target, tmp_path):
    """A command the session started ends with it (SIGTERM), as with the tracefs engine —
    also when the session ends on a broken pipe."""
    path = target("slow.c")
    engine = PtraceEngine()
    with open(tmp_path / "out.txt", "w") as out:
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            engine.attach([make_probe(path, "step")], Target(command=(str(path),)))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    pid = engine.pids[0]
    for item in engine.events():
        if not isinstance(item, EventBatch):
            break  # closing the generator detaches
    assert engine.exit_code == -signal.SIGTERM
    assert not os.path.exists(f"/proc/{pid}")  # reaped
    assert any("still running: terminated" in note for note in engine.stats().notes)


def test_repeated_attach_and_detach_under_load(target):
    """Detach finds threads in slots, at the trampoline and with hijacked returns pending."""
    path = target("stress.c", ("-O0", "-g", "-pthread"))
    probes = [
        make_probe(path, "mix", "a=%di:s64"),
        make_probe(path, "mix", "r=$retval:s64", kind="r", event="mix_ret"),
        make_probe(path, "layer", "r=$retval:s64", kind="r", event="layer_ret"),
    ]
    program = subprocess.Popen([path], stdout=subprocess.PIPE)
    try:
        time.sleep(0.1)
        for round_number in range(5):
            engine = PtraceEngine(pin_cpu=round_number % 2 == 0)
            engine.attach(probes, Target(pids=(program.pid,)))
            seen = 0
            for item in engine.events():
                if not isinstance(item, EventBatch):
                    seen += 1
                    if seen >= 200 + 37 * round_number:
                        break
            assert tracer_of(program.pid) == 0
            assert text_differences(program.pid, path) == []
            time.sleep(0.05)
        out, _ = program.communicate(timeout=30)
        assert out == b"threads with a correct checksum: 4 of 4\n"
        assert program.returncode == 0
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


def test_detach_from_inside_a_handler(target, tmp_path):
    """The re-entrant path a signal handler takes: detach() while a hit is being served."""
    path = target("loop.c")
    probe = make_probe(path, "work", "i=%di:s32")
    ret = make_probe(path, "work", "r=$retval:s32", kind="r", event="work_ret")
    engine = PtraceEngine()

    def detach_on_third(ctx) -> None:
        if ctx.arg("i") == 2:
            engine.detach()

    engine.on(probe, detach_on_third)
    output = tmp_path / "out.txt"
    program = gated([path, "6"], output)
    engine.attach([probe, ret], Target(pids=(program.pid,)))
    program.release()
    events = [e for e in engine.events() if not isinstance(e, EventBatch)]
    assert [(e.name, e.args[0]) for e in events] == [
        ("work", 0),
        ("work_ret", 118),
        ("work", 1),
        ("work_ret", 130),
        ("work", 2),
    ]
    assert program.wait(10) == 3
    assert output.read_bytes() == run_plain([path, "6"]).stdout


def test_attach_and_detach_while_threads_come_and_go(target):
    path = target("churn.c", ("-O0", "-g", "-pthread"))
    probe = make_probe(path, "born", "n=%di:s64")
    program = subprocess.Popen([path], stdout=subprocess.PIPE)
    try:
        time.sleep(0.1)
        for _ in range(4):
            engine = PtraceEngine()
            engine.attach([probe], Target(pids=(program.pid,)))
            tids = set()
            for item in engine.events():
                if not isinstance(item, EventBatch):
                    tids.add(item.tid)
                    if len(tids) >= 20:
                        break
            assert program.pid not in tids
            assert tracer_of(program.pid) == 0
            time.sleep(0.05)
        out, _ = program.communicate(timeout=30)
        assert out == b"sum ok\n" and program.returncode == 0
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


def _signal_dispositions(pid: int) -> tuple[str, str]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return fields["SigCgt"], fields["SigIgn"]


def test_detach_while_a_signal_handler_interrupted_a_slot(target):
    """A signal that arrives during a hit is delivered with the thread in the probed
    instruction's XOL slot, so its handler's signal frame holds a pc in our pages. Detaching
    while the handler runs still unmaps every page and gives back every signal disposition (the
    frame's pc is moved to the original instruction, as the thread's own ip would be), and the
    handler returns to the program's own code."""
    path = target("held_signal.c")
    probe = make_probe(path, "work", "x=%di:s64")  # `push %rbp`: run from its slot
    program = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert program.stdout.readline() == "running\n"
        before_maps = _anonymous_executable_mappings(program.pid)
        before_dispositions = _signal_dispositions(program.pid)
        engine = PtraceEngine()
        sent = []

        def signal_during_the_hit(ctx) -> None:
            if not sent:
                os.kill(ctx.tid, signal.SIGUSR1)  # delivered as the thread resumes in the slot
                sent.append(ctx.tid)

        engine.on(probe, signal_during_the_hit)
        engine.attach([probe], Target(pids=(program.pid,)))
        events = engine.events()
        deadline = time.monotonic() + 30
        for _ in events:  # serve the signal's stop until the handler runs
            if sent and select.select([program.stdout], [], [], 0)[0]:
                break
            assert time.monotonic() < deadline, "the handler never ran"
        assert program.stdout.readline() == "in handler\n"
        events.close()  # detaches
        assert tracer_of(program.pid) == 0
        assert text_differences(program.pid, path) == []
        assert _anonymous_executable_mappings(program.pid) == before_maps
        assert _signal_dispositions(program.pid) == before_dispositions
        program.stdin.write("go\n")
        program.stdin.flush()
        assert program.stdout.readline() == "correct yes\n"
        assert program.wait(10) == 0
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
