"""Why a test guest could not be had (skip) versus why it misbehaved (fail)."""

from __future__ import annotations

from probescope.errors import EngineUnavailable, ProbescopeError


class GuestUnavailable(EngineUnavailable):
    """QEMU, the kernel package or busybox cannot be obtained here; tests skip with this text."""


class GuestError(ProbescopeError):
    """The guest was obtained but misbehaved: it did not boot, died, or broke the protocol."""


class GuestBootError(GuestError):
    """QEMU started but the guest never reported ready; carries the console and QEMU logs."""


class GuestTimeout(GuestError):
    """A command ran longer than its timeout; the guest has been killed."""


class GuestKernelHang(GuestError):
    """The guest kernel itself locked up (its watchdog reported a CPU stuck for minutes); the
    guest has been killed. Not something a user-space test can cause: a caller may retry once
    on a fresh guest."""
