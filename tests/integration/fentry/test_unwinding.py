"""Frames left without returning — C++ exceptions, longjmp — under return probes: the program
behaves as untraced, the unwound frames report no return, the others do (the unwinder hooks put
real return addresses back before the unwinder walks the stack)."""

from __future__ import annotations

import subprocess

import pytest

from probescope.session import Session

from .harness import requires_fentry, target

pytestmark = [pytest.mark.root, requires_fentry]


def traced(specs: list[str], argv: list[str]) -> tuple[dict[str, list[object]], int | None]:
    session = Session(specs, engine="fentry", command=argv)
    by_name: dict[str, list[object]] = {}
    with session:
        for event in session.events(duration=60):
            by_name.setdefault(event.name, []).append(event.args[0] if event.args else None)
    stats = session.summary().stats
    assert stats is not None
    assert stats.extra.get("fallback_probes", 0) == 0
    return by_name, stats.command_status


def test_cxx_exceptions_through_hooked_frames() -> None:
    path = target("exceptions.cc", ("-O0", "-g"))
    plain = subprocess.run([str(path)], capture_output=True, text=True)
    specs = [
        f"{path}:_Z7throweri n=%di:s32",
        f"r:{path}:_Z7throweri r=$retval:s32",
        f"r:{path}:_Z7wrapperi r=$retval:s32",
        f"r:{path}:_Z5outeri r=$retval:s32",
    ]
    events, status = traced(specs, [str(path)])
    assert status == plain.returncode == 0
    # event names come from the demangled symbols (thrower(int) -> thrower)
    assert events["thrower"] == [0, 1, 2, 3, 4, 5, 6, 3]
    assert events["thrower__return"] == [1, 2, 4, 5]
    assert events["wrapper__return"] == [2, 4, 8, 10]
    assert events["outer__return"] == [-1, 2, 4, -1, 8, 10, -1]


def test_longjmp_out_of_hooked_frames() -> None:
    path = target("longjmp.c", ("-O0", "-g"))
    specs = [
        f"{path}:leaf n=%di:s32",
        f"r:{path}:leaf r=$retval:s32",
        f"r:{path}:middle r=$retval:s32",
    ]
    events, status = traced(specs, [str(path)])
    assert status == subprocess.run([str(path)], capture_output=True).returncode
    assert events["leaf"] == [0, 1, 2, 3, 4, 5]
    assert events["leaf__return"] == [0, 1, 2, 4, 5]
    assert events["middle__return"] == [1, 2, 3, 5, 6]
