"""Live kernel: capture raw sub-buffers and the instance's `trace` text of the same events,
decode the sub-buffers with probescope and print them with the text sink: the bytes must be the
kernel's. Everything the capture installs in tracefs must be gone afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures import capture_pages
from fixtures.captured import load_case
from support.tracefs import leftovers

pytestmark = pytest.mark.root


def own_leftovers() -> list[str]:
    pid = os.getpid()
    return [item for item in leftovers() if f"capture_{pid}" in item or f"capture-{pid}" in item]


@pytest.mark.parametrize(
    "name", ["uprobe_types", "strings", "multi_cpu", "time_extend", "lost_overwrite", "subbuf_8k"]
)
def test_decoded_sub_buffers_print_as_the_kernel_trace(name: str, tmp_path: Path) -> None:
    try:
        capture_pages.capture(capture_pages.CASES[name], tmp_path / name)
    finally:
        assert own_leftovers() == []
    case = load_case(tmp_path / name)
    for with_specs in (True, False):
        events = case.events(case.decoder(with_specs=with_specs))
        assert events
        assert case.render(events) == case.trace_body()


def test_instance_and_events_are_removed_when_the_kernel_refuses_a_probe(tmp_path: Path) -> None:
    broken = capture_pages.Case(
        "refused",
        "the second definition names a register x86-64 does not have",
        ("types",),
        (
            capture_pages.Probe("fine", "types_probe", "number=%di:s64"),
            capture_pages.Probe("bad", "types_probe", "x=%nosuchreg"),
        ),
    )
    with pytest.raises(OSError):
        capture_pages.capture(broken, tmp_path / "refused")
    assert own_leftovers() == []
