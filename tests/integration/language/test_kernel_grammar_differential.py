"""Differential test: probescope's kernel-grammar parser against the live kernel's uprobe_events.

For every definition in the corpus (hand-written edge cases plus hypothesis-generated ones) the
kernel and probescope must agree on accept/reject, and for accepted ones probescope's rendering
must equal the line the kernel prints back, byte for byte.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probescope.errors import SpecError
from probescope.language.fetchargs import MAX_TRACE_ARGS
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import DeleteSpec, UprobeLocation
from probescope.system.kernel import RunningKernel
from support.tracefs import tracefs_root

from .corpus import ARGS, NAMES, TYPES, uprobe_corpus
from .kernel_oracle import KernelOracle

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("grammar") / "probe-target.bin"
    shutil.copy("/bin/true", path)
    return path


@pytest.fixture(scope="module")
def oracle() -> KernelOracle:
    root = tracefs_root()
    assert root is not None
    return KernelOracle(root, "uprobe_events")


def ours(definition: str) -> str | None:
    """probescope's rendering, or None when probescope refuses the definition.

    The kernel also refuses a path that is not a regular file; the spec layer knows nothing of
    files, so the test applies that check the way the symbols layer does before installing.
    """
    try:
        spec = parse_kernel_probe(
            definition, events_file=EventsFile.UPROBE_EVENTS, grammar=RunningKernel.read().grammar
        )
    except SpecError:
        return None
    assert not isinstance(spec, DeleteSpec)
    assert isinstance(spec.location, UprobeLocation)
    if not Path(spec.location.path).is_file():
        return None
    return str(spec)


def deliberately_stricter(definition: str) -> bool:
    """Kernels before 6.7 silently drop arguments past the 128th; probescope refuses them."""
    return (
        not RunningKernel.read().grammar.refuses_excess_args
        and len(definition.split()) - 2 > MAX_TRACE_ARGS
    )


def check(oracle: KernelOracle, definition: str) -> None:
    verdict = oracle.judge(definition)
    rendered = ours(definition)
    if deliberately_stricter(definition):
        assert verdict.accepted and rendered is None
        return
    if verdict.accepted:
        assert rendered is not None, f"kernel accepts, probescope refuses: {definition!r}"
        assert rendered == verdict.line, f"rendering differs for {definition!r}"
    else:
        assert rendered is None, (
            f"kernel refuses ({verdict.error}), probescope accepts: {definition!r} -> {rendered}"
        )


CORPUS = uprobe_corpus()


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 300


@pytest.mark.parametrize("template", CORPUS, ids=range(len(CORPUS)))
def test_corpus_agrees_with_kernel(oracle: KernelOracle, target: Path, template: str) -> None:
    check(oracle, template.replace("{P}", str(target)))


_fragments = st.sampled_from(
    [
        "%di",
        "%si",
        "%ax",
        "%ip",
        "$stack",
        "$stack1",
        "$comm",
        "$retval",
        "@0x10",
        "@+8",
        "\\5",
        "\\-1",
        '\\"s"',
        "%rax",
        "$arg1",
        "@sym",
        "x",
    ]
)


@st.composite
def _fetcharg(draw: st.DrawFn) -> str:
    fetch = draw(_fragments)
    for _ in range(draw(st.integers(0, 3))):
        sign = draw(st.sampled_from(["+", "-", "+u", ""]))
        offset = draw(st.sampled_from(["0", "8", "0x10", "010", "x", ""]))
        fetch = f"{sign}{offset}({fetch})"
    return draw(st.sampled_from(NAMES)) + fetch + draw(st.sampled_from(TYPES))


@st.composite
def _definition(draw: st.DrawFn) -> str:
    head = draw(st.sampled_from(["p", "r", "p:ev", "r:ev", "p:g/e", "p:g.e", "p:g/"]))
    offset = draw(st.sampled_from(["0x10", "16", "020", "0x10%return", "0x10(0x8)", "0x0"]))
    args = draw(st.lists(_fetcharg(), max_size=4))
    return " ".join([head, "{P}:" + offset, *args])


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(template=_definition())
def test_generated_definitions_agree_with_kernel(
    oracle: KernelOracle, target: Path, template: str
) -> None:
    check(oracle, template.replace("{P}", str(target)))


def test_nothing_left_behind(target: Path) -> None:
    root = tracefs_root()
    assert root is not None
    assert str(target) not in (root / "uprobe_events").read_text()


def test_args_corpus_covers_every_fetcharg_form() -> None:
    heads = {a[0] for a in ARGS}
    assert {"%", "$", "@", "+", "-", "\\"} <= heads
