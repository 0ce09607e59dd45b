"""The tracefs primitives on a plain directory tree (no kernel): append never truncates."""

from pathlib import Path

import pytest

from probescope.engines.tracefs.dynamic_events import event_names_in
from probescope.engines.tracefs.instance import CpuStats
from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import TracefsError


def test_append_keeps_existing_content_and_write_replaces(tmp_path: Path) -> None:
    (tmp_path / "uprobe_events").write_text("p:a/b /x:0x1\n")
    tracefs = Tracefs(tmp_path)
    tracefs.append("uprobe_events", "p:c/d /y:0x2\n")
    assert tracefs.read("uprobe_events") == "p:a/b /x:0x1\np:c/d /y:0x2\n"
    tracefs.write("uprobe_events", "")
    assert tracefs.read("uprobe_events") == ""


def test_missing_file_is_a_tracefs_error(tmp_path: Path) -> None:
    with pytest.raises(TracefsError, match="cannot open"):
        Tracefs(tmp_path).write("nope/enable", "1")


def test_event_names_of_definitions() -> None:
    text = "p:g1/e1 /bin/true:0x0000000000000010\nr:g2/e2 /bin/true:0x0000000000000020 a=%ax\n"
    assert [str(n) for n in event_names_in(text)] == ["g1/e1", "g2/e2"]


def test_cpu_stats_parse_kernel_text() -> None:
    text = (
        "entries: 5\noverrun: 2\ncommit overrun: 1\nbytes: 400\n"
        "oldest event ts:     0.000000\nnow ts:   787.687463\ndropped events: 3\n"
        "read events: 7\n"
    )
    stats = CpuStats.parse(text)
    assert (stats.entries, stats.overrun, stats.commit_overrun) == (5, 2, 1)
    assert (stats.dropped_events, stats.read_events, stats.lost) == (3, 7, 6)
