"""Differential test of the kprobe grammar against a kernel that has kprobe_events (the QEMU
guest of tests/vm runs it; the host kernel has no kprobes and skips it)."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import DeleteSpec
from probescope.system.kernel import RunningKernel
from support.tracefs import tracefs_root

from .kernel_oracle import KernelOracle
from .kprobe_corpus import kprobe_corpus

pytestmark = pytest.mark.root

CORPUS = kprobe_corpus()


@pytest.fixture(scope="module")
def oracle() -> KernelOracle:
    root = tracefs_root()
    if root is None or not (root / "kprobe_events").exists():
        pytest.skip("this kernel has no kprobe_events; tests/vm runs this in the QEMU guest")
    return KernelOracle(root, "kprobe_events")


def ours(definition: str) -> str | None:
    try:
        spec = parse_kernel_probe(
            definition, events_file=EventsFile.KPROBE_EVENTS, grammar=RunningKernel.read().grammar
        )
    except SpecError:
        return None
    assert not isinstance(spec, DeleteSpec)
    return str(spec)


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 100


@pytest.mark.parametrize("definition", CORPUS, ids=range(len(CORPUS)))
def test_kprobe_corpus_agrees_with_kernel(oracle: KernelOracle, definition: str) -> None:
    verdict = oracle.judge(definition)
    rendered = ours(definition)
    if verdict.accepted:
        assert rendered is not None, f"kernel accepts, probescope refuses: {definition!r}"
        assert rendered == verdict.line, f"rendering differs for {definition!r}"
    else:
        assert rendered is None, (
            f"kernel refuses ({verdict.error}), probescope accepts: {definition!r} -> {rendered}"
        )
