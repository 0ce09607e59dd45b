"""The `guest_kernel` fixture: one QEMU guest on Debian's 6.1 kernel for the whole test session.

Tests that cannot get a guest because QEMU, the kernel package or busybox cannot be obtained are
skipped with the reason (set PROBESCOPE_VM_REQUIRED=1 to fail instead, as `make test-vm` should);
a guest that is obtained but does not boot is a failure, never a skip.

Environment: PROBESCOPE_VM_BOOT_TIMEOUT and PROBESCOPE_VM_COMMAND_TIMEOUT (seconds),
PROBESCOPE_VM_ACCEL (kvm or tcg, no fallback), PROBESCOPE_VM_CACHE (download/initramfs cache),
PROBESCOPE_VM_KERNEL_PACKAGE (e.g. linux-image-6.1.0-50-amd64).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from support.build import CACHE as BUILD_CACHE
from vm.guest import GuestKernel
from vm.guest_errors import GuestUnavailable

# Why no guest can be had in this session, once known, so later tests skip without retrying.
_unavailable: list[str] = []


def _new_guest(**options: Any) -> GuestKernel:
    """A prepared (not yet booted) guest, or skip/fail the calling test when there can be none."""
    if os.environ.get("PROBESCOPE_GUEST_KERNEL"):
        pytest.skip("running inside the probescope test guest already; guests do not nest")
    settings: dict[str, Any] = {
        "boot_timeout": float(os.environ.get("PROBESCOPE_VM_BOOT_TIMEOUT", "300")),
        "command_timeout": float(os.environ.get("PROBESCOPE_VM_COMMAND_TIMEOUT", "600")),
        "writable": [BUILD_CACHE],
        **options,
    }
    guest = GuestKernel(**settings)
    if not _unavailable:
        try:
            guest.prepare()
        except GuestUnavailable as exc:
            _unavailable.append(exc.message + (f" ({exc.hint})" if exc.hint else ""))
    if _unavailable:
        reason = f"test VM unavailable: {_unavailable[0]}"
        if os.environ.get("PROBESCOPE_VM_REQUIRED") == "1":
            pytest.fail(reason + " [PROBESCOPE_VM_REQUIRED=1]", pytrace=False)
        pytest.skip(reason)
    return guest


@pytest.fixture(scope="session")
def guest_kernel() -> Iterator[GuestKernel]:
    """The session's guest, booted once; commands run as root in it via `run()`."""
    guest = _new_guest()
    try:
        guest.start()
        yield guest
    finally:
        guest.close()


@pytest.fixture
def new_guest() -> Iterator[Callable[..., GuestKernel]]:
    """A factory for private guests (GuestKernel options as keywords; each boots on first use).

    Every guest it made is killed after the test.
    """
    made: list[GuestKernel] = []

    def make(**options: Any) -> GuestKernel:
        guest = _new_guest(**options)
        made.append(guest)
        return guest

    yield make
    for guest in made:
        guest.kill()
