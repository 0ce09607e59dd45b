"""Gates for kernel-side probes: kprobes and the function tracer exist only on some kernels
(not on the 6.18 host); tests/vm runs this directory inside the QEMU guest, where they must."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.tracefs import tracefs_root


def _function_tracer_refusal() -> str | None:
    root = tracefs_root()
    if root is None:
        return "no tracefs"
    try:
        (root / "available_filter_functions").read_bytes()[:1]
    except OSError as error:
        return f"this kernel refuses the function tracer ({error.strerror}); the VM tests run it"
    return None


@pytest.fixture
def kprobes() -> None:
    root = tracefs_root()
    if root is None or not (root / "kprobe_events").exists():
        pytest.skip("this kernel has no kprobe events; tests/vm runs these in the QEMU guest")


@pytest.fixture
def function_tracer() -> None:
    reason = _function_tracer_refusal()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def opened_file(tmp_path: Path) -> Path:
    path = tmp_path / "probescope-opened.txt"
    path.write_text("hello\n")
    return path


@pytest.fixture(scope="session")
def loop() -> Path:
    from support.build import compile_program

    source = (Path(__file__).parents[2] / "targets" / "loop.c").read_text()
    return compile_program(source, "loop", ("-O1", "-g"))


def in_guest() -> bool:
    return bool(os.environ.get("PROBESCOPE_GUEST_KERNEL"))
