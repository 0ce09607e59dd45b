"""The compiled report loop prints what the pure-Python path prints, byte for byte, on every
captured case and every text option (lost lines, flag and tgid columns, counter clocks, files
without probescope's facts whose formats are learned while reading), and fails where it fails."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

from probescope.errors import ProbescopeError
from probescope.record.recording import Recording
from probescope.sinks.text import TextSink
from probescope.sinks.text_program import write_text
from probescope.traceevent.accel import DISABLE_VARIABLE, accelerated
from support.report_paths import compiler_present
from unit.record.test_offline_report import PAGE_CASES, fixture_file

OPTIONS = {
    "trace_pipe": {"lost_lines": True},
    "no_irq_info": {"irq_info": False, "lost_lines": True},
    "tgids": {"tgids": True},
    "counter_clock": {"clock": "counter"},
}


def test_the_accelerator_is_built_where_a_compiler_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLE_VARIABLE, raising=False)
    if not compiler_present():
        pytest.skip("no C compiler here: the install leaves the accelerator out")
    assert accelerated()
    monkeypatch.setenv(DISABLE_VARIABLE, "1")
    assert not accelerated()
    monkeypatch.setenv(DISABLE_VARIABLE, "0")
    assert accelerated()


def report(path: Path, options: dict[str, object], *, compiled: bool) -> tuple[bytes, object]:
    """The text of a recording and what the run counted, through one path."""
    out = io.BytesIO()
    with Recording.from_path(path) as recording:
        kwargs = dict(options)
        if kwargs.get("tgids"):
            kwargs["tgids"] = recording.context.tgids
        kwargs.setdefault("clock", recording.clock)
        sink = TextSink(out, context=recording.context, **kwargs)  # type: ignore[arg-type]
        with pytest.MonkeyPatch.context() as patch:
            if compiled:
                patch.delenv(DISABLE_VARIABLE, raising=False)
            else:
                patch.setenv(DISABLE_VARIABLE, "1")
            try:
                counts: object = write_text(recording, sink)
            except ProbescopeError as error:
                counts = ("error", type(error).__name__, error.message)
        return out.getvalue(), (counts, dict(recording.skipped), dict(recording.refused))


needs_accelerator = pytest.mark.skipif(
    not accelerated(), reason="the report accelerator is not built here"
)


@needs_accelerator
@pytest.mark.parametrize("with_facts", [True, False], ids=["probescope", "trace-cmd"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("case", PAGE_CASES, ids=[p.name for p in PAGE_CASES])
def test_both_paths_print_the_same_bytes(
    case: Path, option: str, with_facts: bool, tmp_path: Path
) -> None:
    path = tmp_path / "trace.dat"
    fixture_file(case, path, with_facts=with_facts)
    compiled = report(path, OPTIONS[option], compiled=True)
    python = report(path, OPTIONS[option], compiled=False)
    assert compiled[0].count(b"\n") >= 3
    assert compiled == python


def corrupt(path: Path, tmp_path: Path, how: str) -> Path:
    """A copy of a recording with a sub-buffer of its last CPU damaged: the second one, so the
    lines before it are printed first, or the first when there is one."""
    with Recording.from_path(path) as recording:
        buffer = recording.dat.buffers[0]
        cpu = [c for c in buffer.cpus if c.size][-1]
        at = cpu.offset + (buffer.page_size if cpu.size > buffer.page_size else 0)
    data = bytearray(path.read_bytes())
    if how == "commit":  # commit says more bytes of records than the sub-buffer holds
        struct.pack_into("<Q", data, at + 8, 0xFFFF)
    elif how == "type_len":  # the first record's payload runs past the end of the records
        struct.pack_into("<I", data, at + 16, 28)
        struct.pack_into("<Q", data, at + 8, 40)
    elif how == "event_id":  # the first record is of an event id the file has no format for
        struct.pack_into("<H", data, at + 20, 0xFFF0)
    damaged = tmp_path / f"{how}.dat"
    damaged.write_bytes(bytes(data))
    return damaged


@needs_accelerator
@pytest.mark.parametrize("how", ["commit", "type_len", "event_id"])
@pytest.mark.parametrize("case", ["multi_cpu", "tracepoints", "lost_overwrite"])
def test_a_damaged_recording_fails_alike_after_the_same_lines(
    case: str, how: str, tmp_path: Path
) -> None:
    path = tmp_path / "trace.dat"
    fixture_file(next(p for p in PAGE_CASES if p.name == case), path, with_facts=True)
    damaged = corrupt(path, tmp_path, how)
    compiled = report(damaged, {"lost_lines": True}, compiled=True)
    python = report(damaged, {"lost_lines": True}, compiled=False)
    assert compiled == python
    assert compiled != report(path, {"lost_lines": True}, compiled=True)
