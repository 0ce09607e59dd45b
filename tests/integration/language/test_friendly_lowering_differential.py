"""Differential test: friendly arguments lowered by probescope, judged by the live kernel.

Generated friendly uprobe arguments (argN, $argN, retval among the kernel's own fetches, with
names, types and dereferences) that probescope accepts are lowered for a probe at a function's
entry, inside it, and on its return; the definition must be accepted by the kernel's
uprobe_events and printed back exactly as probescope renders it. Events are named after this
process and removed again.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probescope.errors import SpecError
from probescope.language.arch import host_arch
from probescope.language.friendly import FriendlyProbe, lower_args
from probescope.language.model import ProbeSpec, UprobeLocation
from probescope.language.parse import parse_probe
from probescope.system.kernel import RunningKernel
from support.tracefs import tracefs_root
from unit.language.friendly_arguments import ARGUMENTS

from .kernel_oracle import KernelOracle

pytestmark = pytest.mark.root

GROUP = f"probescope_lowering_{os.getpid()}"
GRAMMAR = RunningKernel.read().grammar


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lowering") / "lowering-target.bin"
    shutil.copy("/bin/true", path)
    return path


@pytest.fixture(scope="module")
def oracle() -> KernelOracle:
    root = tracefs_root()
    assert root is not None
    return KernelOracle(root, "uprobe_events")


def lowered(head: str, args: list[str], path: Path) -> ProbeSpec | None:
    """The kernel definition probescope makes of `head ARGS` at PATH:0x10, or None if refused."""
    arch = host_arch()
    try:
        probe = parse_probe(" ".join([head, *args]), arch=arch, grammar=GRAMMAR)
        assert isinstance(probe, FriendlyProbe)
        fetchargs = lower_args(probe, arch, on_entry="+" not in head)
    except SpecError:
        return None
    spec = ProbeSpec(kind=probe.kind, location=UprobeLocation(str(path), 0x10), args=fetchargs)
    return replace(spec, group=GROUP, event="lowered")


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(head=st.sampled_from(["x:main", "x:main+4", "r:x:main"]), args=ARGUMENTS)
def test_lowered_arguments_are_what_the_kernel_accepts_and_echoes(
    oracle: KernelOracle, target: Path, head: str, args: list[str]
) -> None:
    spec = lowered(head, args, target)
    if spec is None:
        return
    verdict = oracle.judge(spec.definition())
    assert verdict.accepted, f"kernel refuses {spec.definition()!r}: {verdict.error}"
    assert verdict.line == str(spec)


def test_nothing_left_behind() -> None:
    root = tracefs_root()
    assert root is not None
    assert GROUP not in (root / "uprobe_events").read_text()
