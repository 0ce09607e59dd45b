"""A trace.dat of pages the kernel wrote (captured fixtures) reports exactly what the kernel's
`trace` printed for them, with the live machine out of reach: nothing under /proc or /sys is
opened and the running kernel's release is not asked (the guard of test_offline_context)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from probescope.events import EventBatch
from probescope.record.facts import RecordingFacts
from probescope.record.recording import Recording
from probescope.record.tracedat import OPTION_PROBESCOPE, OPTION_TRACECLOCK, TraceDat
from probescope.record.tracedat_writer import CpuSource, TraceDatContents, write_tracedat
from probescope.sinks.base import open_sink
from probescope.sinks.text_program import write_text
from support.report_paths import report_path  # noqa: F401
from unit.traceevent.test_offline_context import no_live_kernel, trace_body  # noqa: F401

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PAGE_CASES = sorted(p.parent for p in FIXTURES.glob("kernel-*/*/meta.json"))


def fixture_file(case: Path, target: Path, *, with_facts: bool) -> dict[str, object]:
    """A trace.dat of a captured case, as `probescope record` lays one out."""
    meta: dict[str, object] = json.loads((case / "meta.json").read_text())
    formats = [
        (p.name.split(".", 1)[0], p.read_bytes()) for p in sorted((case / "formats").iterdir())
    ]
    options = [(OPTION_TRACECLOCK, f"[{meta['clock']}]".encode() + b"\0")]
    if with_facts:
        from probescope.traceevent.format import parse_saved_tgids

        tgids = parse_saved_tgids((case / "saved_tgids").read_bytes())
        facts = RecordingFacts(engine="tracefs", release=str(meta["release"]), tgids=tgids)
        options.append((OPTION_PROBESCOPE, facts.to_option()))
    cpus = list(meta["cpus"])  # type: ignore[call-overload]
    contents = TraceDatContents(
        header_page=(case / "header_page").read_bytes(),
        header_event=(case / "header_event").read_bytes(),
        event_formats=formats,
        saved_cmdlines=(case / "saved_cmdlines").read_bytes(),
        options=options,
        page_size=int(meta["sub_buffer_size"]),  # type: ignore[call-overload]
    )
    sources = [
        CpuSource(data=(case / f"cpu{cpu}.raw").read_bytes()) for cpu in range(max(cpus) + 1)
    ]
    with open(target, "wb") as stream:
        write_tracedat(stream, contents, sources)
    return meta


@pytest.mark.parametrize("case", PAGE_CASES, ids=[f"{p.parent.name}/{p.name}" for p in PAGE_CASES])
def test_a_recording_reports_what_the_kernel_printed(
    case: Path,
    tmp_path: Path,
    no_live_kernel: list[str],  # noqa: F811
    report_path: str,  # noqa: F811
) -> None:
    path = tmp_path / "trace.dat"
    meta = fixture_file(case, path, with_facts=True)
    with Recording.from_path(path) as recording:
        out = io.BytesIO()
        sink = open_sink(
            "text",
            out,
            context=recording.context,
            clock=recording.clock,
            tgids=recording.context.tgids if meta["record_tgid"] else None,
            irq_info=bool(meta["irq_info"]),
            lost_lines=False,  # `trace` does not print losses; `trace_pipe` does
        )
        write_text(recording, sink)
        assert recording.context.release == meta["release"]
        assert recording.skipped == {}
    assert out.getvalue() == trace_body((case / "trace").read_bytes())


def test_a_file_without_probescope_facts_still_reads(tmp_path: Path) -> None:
    case = FIXTURES / "kernel-6.18.44-fc-v657" / "uprobe_types"
    path = tmp_path / "trace.dat"
    fixture_file(case, path, with_facts=False)
    with Recording.from_path(path) as recording:
        assert not recording.written_by_probescope
        events = [e for b in recording.batches() for e in b.events]
        assert events and {e.type.name for e in events} == {"types", "types_ret"}
        text = io.StringIO()
        sink = open_sink("text", text, context=recording.context)
        sink.write_batch(EventBatch(events[:1]))
        assert "types: (0x" in text.getvalue()
    with TraceDat.from_path(path) as dat:
        assert dat.trace_clock == "local"
