"""The dead man's switch's handler on its own, without any tracer: a C harness maps the image
as the engine does, patches sites with our trap bytes and puts each thread state a killed
probescope can leave behind — a hit not yet served (`hlt`, int3s, one byte into them), a
return through the trampoline, a thread lent to an injected system call — and checks the
program goes on correctly with its text restored; its own traps keep their default action."""

from __future__ import annotations

import signal
import subprocess

import pytest

from probescope.engines.ptrace.dead_mans_switch_code import CONSTANTS, IMAGE, LABELS

_OFFSETS = [
    LABELS[name]
    for name in (
        "site_count",
        "trampoline",
        "injection_resume",
        "saved_gregs",
        "action",
        "handler",
        "restorer",
        "proc_self_mem",
    )
] + [CONSTANTS[name] for name in ("SITES_OFFSET", "RETURNS_OFFSET", "AREA_SIZE")]


@pytest.fixture(scope="module")
def harness(target, tmp_path_factory) -> list[str]:
    image = tmp_path_factory.mktemp("switch") / "image.bin"
    image.write_bytes(IMAGE)
    program = target("switch_harness.c", ("-O1", "-g"))
    return [str(program), str(image)]


def _run(harness: list[str], scenario: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*harness[:2], scenario, *(f"{o:x}" for o in _OFFSETS)],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("scenario", "output"),
    [
        ("hlt", "result 42\ntext restored 1\n"),
        ("int3", "result 42\ntext restored 1\n"),
        ("tail", "result 42\nother site restored 1\ntext restored 1\n"),
        ("slot", "result 42\nstill patched 1\n"),
        ("trampoline", "result 7\ntext restored 1\n"),
        ("injection", "resumed with the saved registers\n"),
    ],
)
def test_the_handler_resumes_what_a_dead_tracer_left(harness, scenario, output):
    done = _run(harness, scenario)
    assert (done.returncode, done.stdout) == (0, output)


@pytest.mark.parametrize(
    ("scenario", "signum"),
    [("own-int3", signal.SIGTRAP), ("own-segv", signal.SIGSEGV), ("kill", signal.SIGTRAP)],
)
def test_other_signals_keep_their_default_action(harness, scenario, signum):
    done = _run(harness, scenario)
    assert done.returncode == -signum
    assert done.stdout == ""
