"""`probescope record` and `probescope report` on the live kernel, against trace-cmd.

A recording of the tracefs engine is trace-cmd's file: `trace-cmd report` prints the same
events (comm, pid, cpu, timestamp, name, arguments) as `probescope report`; every engine's
recording reports what its live session prints; a file `trace-cmd extract` wrote from an
instance filled here reports what trace-cmd reports; the Perfetto and Parquet outputs of a
recording agree with its events, and a DuckDB query over the Parquet file counts what
`probescope count --input` counts. Nothing is left in tracefs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from integration.tracefs_engine.conftest import target
from probescope.traceevent.accel import DISABLE_VARIABLE
from support.cli import probescope
from support.tracefs import (
    skip_reason,
    trace_cmd_recording,
)

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]
TRACE_CMD = shutil.which("trace-cmd")
needs_trace_cmd = pytest.mark.skipif(TRACE_CMD is None, reason="trace-cmd is not installed")

OURS = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<tid>\d+)\s+\[(?P<cpu>\d+)\] \S{5}\s+(?P<ts>\d+\.\d+): "
    r"(?P<event>[^:]+): (?P<body>.*)$"
)
THEIRS = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<ts>\d+\.\d+): "
    r"(?P<event>[^:]+):\s+(?P<body>.*)$"
)
PROBE_HEAD = re.compile(
    r"^\((?P<a>(?:0x)?[0-9a-f]+)(?: <- (?P<b>(?:0x)?[0-9a-f]+))?\)(?P<rest>.*)$"
)


def specs(loop: Path) -> list[str]:
    return [
        f"{loop}:func_2 a=arg1:s64 b=arg2:s32",
        f"r:{loop}:func_2 ret=retval:s64",
        f"{loop}:named n=+0(arg1):string",
    ]


def parsed(text: str, pattern: re.Pattern[str]) -> list[dict[str, str]]:
    return [m.groupdict() for m in map(pattern.match, text.splitlines()) if m]


def probe_key(line: dict[str, str], *, kernel_order: bool) -> tuple[str, ...]:
    """(comm, tid, cpu, ts, event, probed address, arguments): trace-cmd prints a return's
    `(func <- ret)` without 0x, the kernel's `trace` `(0xret <- 0xfunc)`."""
    head = PROBE_HEAD.match(line["body"])
    assert head, line
    a, b = (x.removeprefix("0x") if x else x for x in (head["a"], head["b"]))
    function = (b if kernel_order else a) if b else a
    return (
        line["comm"],
        line["tid"],
        line["cpu"],
        line["ts"],
        line["event"],
        function or "",
        head["rest"].strip(),
    )


@needs_trace_cmd
def test_trace_cmd_reads_a_tracefs_recording_as_probescope_does(loop: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.dat"
    probescope(
        "record",
        "-q",
        "--engine",
        "tracefs",
        "-o",
        str(out),
        "-c",
        f"{loop} 40",
        *specs(loop),
        "t:sched:sched_process_exit",
    )
    ours = report_both(out)
    theirs = subprocess.run(
        [TRACE_CMD, "report", str(out)],
        capture_output=True,
        text=True,
        check=True,
        errors="surrogateescape",
    ).stdout
    our_lines, their_lines = parsed(ours, OURS), parsed(theirs, THEIRS)
    assert len(our_lines) == len(their_lines) >= 120
    probes = [row for row in our_lines if row["event"] != "sched_process_exit"]
    assert Counter(row["event"] for row in probes) == {
        "func_2": 40,
        "func_2__return": 40,
        "named": 40,
    }
    assert sorted(probe_key(row, kernel_order=True) for row in probes) == sorted(
        probe_key(row, kernel_order=False)
        for row in their_lines
        if row["event"] != "sched_process_exit"
    )

    def exits(lines):
        return sorted(
            (row["tid"], row["ts"], row["body"].split())
            for row in lines
            if row["event"] == "sched_process_exit"
        )

    assert exits(our_lines) == exits(their_lines) != []


def normalized(text: str) -> list[tuple[str, ...]]:
    """Lines without what differs between two runs: times, ids, addresses, CPUs, flags."""
    rows = []
    for line in parsed(text, OURS):
        body = re.sub(r"0x[0-9a-f]+", "ADDR", line["body"])
        rows.append((line["comm"], line["event"], body))
    return rows


@pytest.mark.parametrize("engine", ["tracefs", "ptrace", "bpf", "fentry"])
def test_a_recording_reports_what_the_live_session_prints(
    engine: str, loop: Path, tmp_path: Path
) -> None:
    available = probescope("engines", check=False).stdout
    if (
        not re.search(rf"^\s*{engine}\b.*\byes\b", available, re.MULTILINE | re.IGNORECASE)
        and engine != "tracefs"
    ):
        pytest.skip(f"the {engine} engine cannot run here")
    live = probescope("trace", "-q", "--engine", engine, "-c", f"{loop} 25", *specs(loop)).stdout
    out = tmp_path / f"{engine}.dat"
    probescope("record", "-q", "--engine", engine, "-o", str(out), "-c", f"{loop} 25", *specs(loop))
    reported = report_both(out)
    assert normalized(reported) == normalized(live)
    assert len(normalized(reported)) == 75
    jsonl = probescope("report", "-q", "-f", "jsonl", str(out)).stdout.splitlines()
    assert Counter(json.loads(line)["event"] for line in jsonl) == {
        "func_2": 25,
        "func_2__return": 25,
        "named": 25,
    }
    if TRACE_CMD is not None:
        theirs = subprocess.run(
            [TRACE_CMD, "report", str(out)],
            capture_output=True,
            text=True,
            check=True,
            errors="surrogateescape",
        ).stdout
        assert len(parsed(theirs, THEIRS)) == 75


@needs_trace_cmd
def test_a_file_trace_cmd_wrote_reports_as_trace_cmd_reports_it(loop: Path, tmp_path: Path) -> None:
    assert TRACE_CMD is not None
    definitions = [d for d in probescope("resolve", *specs(loop)).stdout.split("\n") if d.strip()]
    names = ["func_2", "func_2__return", "named"]
    out = tmp_path / "tc.dat"
    instance = trace_cmd_recording(
        TRACE_CMD,
        out,
        dict(zip(names, definitions, strict=True)),
        [str(loop), "15"],
        tag="pstest",
        settings={"trace_clock": "mono"},
        tracepoints=("sched/sched_process_exec",),
    )
    theirs = subprocess.run(
        [TRACE_CMD, "report", str(out)],
        capture_output=True,
        text=True,
        check=True,
        errors="surrogateescape",
    ).stdout
    their_lines = parsed(re.sub(rf"^{instance}: ", "", theirs, flags=re.MULTILINE), THEIRS)
    ours = report_both(out)
    our_lines = parsed(ours, OURS)
    mine = [row for row in our_lines if row["event"] in names]
    assert len(mine) == 45
    assert sorted(probe_key(row, kernel_order=True) for row in mine) == sorted(
        probe_key(row, kernel_order=False) for row in their_lines if row["event"] in names
    )

    def execs(lines):
        return sorted(
            (row["ts"], row["body"].split())
            for row in lines
            if row["event"] == "sched_process_exec"
        )

    assert execs(our_lines) == execs(their_lines) != []


def test_perfetto_and_parquet_agree_with_the_recording(loop: Path, tmp_path: Path) -> None:
    pb2 = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "trace.dat"
    probescope("record", "-q", "-o", str(out), "-c", f"{loop} 30", *specs(loop))
    events = [
        json.loads(row)
        for row in probescope("report", "-q", "-f", "jsonl", str(out)).stdout.splitlines()
    ]
    counts = Counter(e["event"] for e in events)
    probescope("report", "-q", "-f", "perfetto", "-o", str(tmp_path / "t.pftrace"), str(out))
    trace = pb2.Trace()
    trace.ParseFromString((tmp_path / "t.pftrace").read_bytes())
    tracked = [p for p in trace.packet if p.HasField("track_event")]
    begins = [p.timestamp for p in tracked if p.track_event.type == pb2.TrackEvent.TYPE_SLICE_BEGIN]
    ends = [p.timestamp for p in tracked if p.track_event.type == pb2.TrackEvent.TYPE_SLICE_END]
    entries = [e["ts"] for e in events if e["event"] == "func_2"]
    returns = [e["ts"] for e in events if e["event"] == "func_2__return"]
    assert begins == entries and ends == returns and len(begins) == 30
    assert [b - a for a, b in zip(begins, ends, strict=False)] == [
        b - a for a, b in zip(entries, returns, strict=False)
    ]
    instants = [p for p in tracked if p.track_event.type == pb2.TrackEvent.TYPE_INSTANT]
    assert {p.track_event.name for p in instants} == {"named"}
    probescope("report", "-q", "-f", "parquet", "-o", str(tmp_path / "t.parquet"), str(out))
    rows = duckdb.sql(
        f"select event, count(*) from '{tmp_path / 't.parquet'}' group by event"
    ).fetchall()
    assert dict(rows) == dict(counts)
    counted = probescope("count", "-q", "--input", str(out)).stdout
    assert dict(rows) == {
        m["event"]: int(m["n"])
        for m in re.finditer(r"^@count\[(?P<event>[^\]]+)\]: (?P<n>\d+)$", counted, re.MULTILINE)
    }
    assert duckdb.sql(
        f"select count(*) from '{tmp_path / 't.parquet'}' where args_named.n = 'alpha'"
    ).fetchall() == [(10,)]


def test_what_is_not_a_recording_is_refused_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "not.dat"
    bad.write_text("hello\n")
    result = probescope("report", str(bad), check=False)
    assert result.returncode == 2
    assert "not a trace.dat file" in result.stderr and "Traceback" not in result.stderr


def test_an_output_that_cannot_be_written_is_refused_before_anything_runs(
    loop: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    for output, message in (
        (tmp_path / "missing" / "x.dat", "its directory does not exist"),
        (tmp_path, "it is a directory"),
    ):
        result = probescope(
            "record", "-o", str(output), "-c", f"touch {marker}", f"{loop}:func_1", check=False
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not marker.exists()  # the command never started


def report_both(path: Path, *args: str) -> str:
    """`probescope report` through the compiled loop and through pure Python: the same bytes
    (the compiled run is checked to be one in tests/unit/record/test_report_accelerator.py)."""
    compiled = subprocess.run(
        [sys.executable, "-m", "probescope", "report", "-q", *args, str(path)],
        capture_output=True,
        check=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != DISABLE_VARIABLE},
    ).stdout
    python = subprocess.run(
        [sys.executable, "-m", "probescope", "report", "-q", *args, str(path)],
        capture_output=True,
        check=True,
        timeout=120,
        env={**os.environ, DISABLE_VARIABLE: "1"},
    ).stdout
    assert compiled == python
    return compiled.decode("utf-8", "surrogateescape")


def test_the_compiled_report_prints_what_python_prints(tmp_path: Path) -> None:
    """Every argument printer the compiled loop has, on both CPUs, with a tracepoint it leaves
    to Python interleaved in the same merged stream."""
    program = target("argtypes", ("-O1", "-g", "-pthread"))
    out = tmp_path / "types.dat"
    probescope(
        "record",
        "-q",
        "--engine",
        "tracefs",
        "-o",
        str(out),
        "-c",
        f"{program} 400",
        f"{program}:mix a=arg1:s8 b=arg2:u16 c=arg3:x32 d=arg4:s64 s=+0(arg5):string l=arg6:char",
        f"r:{program}:mix ret=retval:s64",
        "t:sched:sched_switch",
    )
    text = report_both(out)
    lines = parsed(text, OURS)
    events = Counter(row["event"] for row in lines)
    assert events["mix"] == events["mix__return"] == 800
    assert events["sched_switch"] > 0
    if (os.cpu_count() or 1) > 1:
        assert {row["cpu"] for row in lines if row["event"] == "mix"} == {"000", "001"}
    assert "(fault)" in text and 's=""' in text and 's="café"' in text
    assert report_both(out, "-o", "/dev/stdout") == text
