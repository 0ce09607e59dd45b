"""Decode sub-buffers captured from a live kernel (tests/fixtures/kernel-<release>/) and compare
with the kernel's own `trace` text of the same events, byte for byte. No kernel access."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from fixtures.captured import CapturedCase, case_paths, load_case
from probescope.language.model import ProbeKind
from probescope.traceevent import decoder as decoder_module
from probescope.traceevent.ringbuffer import LOST_UNKNOWN, iter_records, split_sub_buffers

CASES = case_paths()
UPROBE_CASES = [p for p in CASES if (p / "formats").is_dir() and not p.name.startswith("trace")]


def case_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_fixtures_exist() -> None:
    names = {p.name for p in CASES}
    assert {"uprobe_types", "multi_cpu", "lost_overwrite", "strings", "time_extend"} <= names


@pytest.mark.parametrize("path", UPROBE_CASES, ids=case_id)
@pytest.mark.parametrize("with_specs", [True, False], ids=["spec-types", "format-types"])
def test_text_sink_reproduces_the_kernel_trace(path: Path, with_specs: bool) -> None:
    case = load_case(path)
    events = case.events(case.decoder(with_specs=with_specs))
    assert events, "the capture holds events"
    assert case.render(events) == case.trace_body()


@pytest.mark.parametrize("path", UPROBE_CASES, ids=case_id)
def test_table_dispatch_decodes_the_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = load_case(path)
    inline = case.events(case.decoder())
    monkeypatch.setattr(decoder_module, "INLINE_EVENT_LIMIT", 0)
    table = case.events(case.decoder())
    assert [e._replace(type=e.name) for e in inline] == [e._replace(type=e.name) for e in table]


@pytest.mark.parametrize("path", CASES, ids=case_id)
def test_every_record_is_decoded(path: Path) -> None:
    case = load_case(path)
    records = sum(
        len(list(iter_records(case.layout, page)))
        for data in case.raw.values()
        for page in split_sub_buffers(case.layout, data)
    )
    assert len(case.events(case.decoder())) == records


def named_case(name: str) -> CapturedCase:
    matches = [p for p in CASES if p.name == name]
    if not matches:
        pytest.skip(f"no captured {name} case")
    return load_case(matches[-1])


def test_types_case_values() -> None:
    case = named_case("uprobe_types")
    events = case.events(case.decoder())
    entries = [e for e in events if e.kind is ProbeKind.UPROBE]
    returns = [e for e in events if e.kind is ProbeKind.URETPROBE]
    assert len(entries) == len(returns) == 6
    assert [e.arg("text") for e in entries] == [
        "hello",
        "",
        "héllo wörld",
        "\udcff\udcfe raw",
        None,
        '%s %d \\ "quoted"',
    ]
    assert [e.arg("letter") for e in entries] == ["Z", "\0", "\udcc8", " ", "%", "\n"]
    assert entries[3].arg("number") == -(1 << 40)
    assert entries[5].arg("small") == -(1 << 31)
    assert [e.arg("mid") for e in entries] == [(i * 7) & 31 for i in range(6)]
    assert entries[0].arg("sbytes") == (0, 2, -6, -1)
    # immediate strings fault on uprobes of this kernel (see the capture's trace text)
    assert {e.arg("lit") for e in entries} == {None}
    assert {e.arg("who") for e in returns} == {"ps_capture"}
    for entry, ret in zip(entries, returns, strict=True):
        assert ret.ip == entry.ip and ret.ret_ip is not None and ret.ret_ip != ret.ip


def test_multi_cpu_case_interleaves_two_named_threads() -> None:
    case = named_case("multi_cpu")
    events = case.events(case.decoder())
    assert {(e.comm, e.cpu) for e in events} == {("worker-a", 0), ("worker-b", 1)}
    assert len({e.pid for e in events}) == 1 and len({e.tid for e in events}) == 2
    stamps = [e.timestamp_ns for e in events]
    assert stamps == sorted(stamps)
    switches = sum(1 for a, b in itertools.pairwise(events) if a.cpu != b.cpu)
    assert switches > 4, "the two CPUs' events interleave"


def test_overwritten_events_are_flagged_as_lost() -> None:
    case = named_case("lost_overwrite")
    batches = case.batches(case.decoder())[0]
    assert batches[0].lost == LOST_UNKNOWN  # a full first page has no room for the count
    assert all(b.lost == 0 for b in batches[1:])
    iterations = [e.arg("iteration") for b in batches for e in b.events]
    assert iterations == list(range(iterations[0], 20000))
    assert iterations[0] > 0


def test_dropped_events_without_overwrite_are_not_flagged_in_pages() -> None:
    case = named_case("lost_no_overwrite")
    batches = case.batches(case.decoder())[0]
    assert all(b.lost == 0 for b in batches)
    iterations = [e.arg("iteration") for b in batches for e in b.events]
    assert iterations == list(range(len(iterations)))
    stats = (case.path / "cpu0.stats").read_text()
    assert re.search(r"dropped events: (\d+)", stats).group(1) == str(20000 - len(iterations))  # type: ignore[union-attr]


def test_long_records_and_string_arrays() -> None:
    case = named_case("strings")
    events = case.events(case.decoder())
    assert [e.arg("names") for e in events] == [
        ("alpha", "beta"),
        ("gamma", None),
        ("alpha", "beta"),
    ]
    assert [e.arg("maybe") for e in events] == ["maybe", None, ""]
    long_text = events[0].arg("long_text")
    assert len(long_text) == 300 and long_text.startswith("axxxxxxxxxbxxxxxxxxxc")
    assert len(events[2].arg("long_text")) == 120
    assert [e.arg("first") for e in events] == ["alpha", "gamma", "alpha"]


def test_time_extend_case() -> None:
    case = named_case("time_extend")
    events = case.events(case.decoder())
    entries = [e for e in events if e.kind is ProbeKind.UPROBE]
    gaps = [b.timestamp_ns - a.timestamp_ns for a, b in itertools.pairwise(entries)]
    assert [gap > (1 << 27) for gap in gaps] == [True, False, True]


def test_eight_kib_sub_buffers() -> None:
    case = named_case("subbuf_8k")
    assert case.layout.size == 8192
    assert len(case.raw[0]) % 8192 == 0


def test_tracepoint_values_agree_with_the_kernel_text() -> None:
    case = named_case("tracepoints")
    events = case.events(case.decoder())
    lines = case.trace_body().decode().splitlines()
    assert len(lines) == len(events)
    for event, line in zip(events, lines, strict=True):
        assert event.kind is ProbeKind.TRACEPOINT
        assert f"-{event.tid} " in line and f"[{event.cpu:03d}]" in line
        assert f" {event.name}: " in line
        if event.name == "sched_process_exec":
            assert f"filename={event.arg('filename')} pid={event.arg('pid')} " in line
        if event.name == "sched_process_fork":
            assert f"comm={event.arg('parent_comm')} pid={event.arg('parent_pid')} " in line
            assert line.endswith(f"child_pid={event.arg('child_pid')}")
        if event.name == "sched_process_exit":
            assert f"comm={event.arg('comm')} pid={event.arg('pid')} " in line
