"""probescope's kernel-side suites run inside the 6.1 guest: kprobes, kretprobes and the
function tracer (which the host kernel lacks or refuses), the tracefs-engine end-to-end and
text-fidelity tests on a second kernel version, and the grammar differential tests against
that kernel's uprobe_events and kprobe_events. A failure, error or skip inside the guest fails
here."""

from __future__ import annotations

import pytest

from vm.guest import GuestKernel
from vm.guest_errors import GuestKernelHang, GuestTimeout

pytestmark = pytest.mark.vm
SUITE_TIMEOUT = 480
"""Seconds for one guest suite: the longest (tracefs) takes ~150-200 s under TCG."""


def run_in_guest(guest: GuestKernel, paths: list[str], *, allow_skips: bool = False) -> None:
    try:
        run = guest.run_pytest([*paths, "-q"], timeout=SUITE_TIMEOUT)
    except (GuestKernelHang, GuestTimeout) as hang:
        # The 6.1 guest under TCG hangs now and then (a soft lockup in text_poke_bp's IPI was
        # caught once; a suite of ~150 s has also sat for 15 minutes): once more, fresh.
        print(f"\nthe guest hung; running {paths} again on a fresh guest:\n{hang}")
        run = guest.run_pytest([*paths, "-q"], timeout=SUITE_TIMEOUT)
    assert run.cases, run.report()
    failed = {k: v for k, v in run.outcomes().items() if v in ("failed", "error")}
    assert not failed, f"{failed}\n{run.report()}"
    if not allow_skips:
        skipped = [k for k, v in run.outcomes().items() if v == "skipped"]
        assert not skipped, f"skipped in the guest: {skipped}\n{run.report()}"


def test_kprobes_and_function_tracer(guest_kernel: GuestKernel) -> None:
    run_in_guest(guest_kernel, ["tests/integration/kernel_probes"])


def test_tracefs_engine_on_the_second_kernel(guest_kernel: GuestKernel) -> None:
    run_in_guest(guest_kernel, ["tests/integration/tracefs_engine"], allow_skips=True)


def test_grammar_against_the_second_kernel(guest_kernel: GuestKernel) -> None:
    run_in_guest(guest_kernel, ["tests/integration/language"])
