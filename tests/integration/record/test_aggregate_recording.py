"""`probescope count|hist|latency --input FILE` against the live commands and trace-cmd.

A deterministic program is recorded with `probescope record`, then the recording aggregated
offline must give what the live aggregation commands give on the same program (exact counts,
the same histograms); a file trace-cmd wrote is counted as trace-cmd reports it; bad input
exits 2 without a traceback. Nothing is left in tracefs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

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
ROUNDS = 30


def entry(loop: Path) -> str:
    return f"{loop}:func_2 a=arg1:s64 b=arg2:s32"


@pytest.fixture(scope="module")
def recording(loop: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recording") / "trace.dat"
    probescope(
        "record",
        "-q",
        "-o",
        str(out),
        "-c",
        f"{loop} {ROUNDS}",
        entry(loop),
        f"r:{loop}:func_2 ret=retval:s64",
        f"{loop}:named n=+0(arg1):string",
    )
    return out


def maps(stdout: str) -> list[str]:
    """The value lines (without the blank lines between maps and the program's own line)."""
    return [line for line in stdout.splitlines() if line.strip() and not line.startswith("total")]


def test_count_of_a_recording_is_the_live_count(loop: Path, recording: Path) -> None:
    live = probescope("count", "-q", entry(loop), f"{loop}:named", "-c", f"{loop} {ROUNDS}")
    offline = probescope("count", "-q", "--input", str(recording), "func_2", "named")
    assert maps(offline.stdout) == maps(live.stdout) == ["@count[func_2]: 30", "@count[named]: 30"]
    everything = probescope("count", "--input", str(recording))
    assert sorted(maps(everything.stdout)) == [
        "@count[func_2]: 30",
        "@count[func_2__return]: 30",
        "@count[named]: 30",
    ]
    assert "90 events aggregated" in everything.stderr
    by_b = probescope("count", "-q", "--input", str(recording), "func_2", "--by", "b")
    live_b = probescope("count", "-q", entry(loop), "--by", "b", "-c", f"{loop} {ROUNDS}")
    assert sorted(maps(by_b.stdout)) == sorted(maps(live_b.stdout))
    assert len(maps(by_b.stdout)) == ROUNDS
    globbed = probescope("count", "-q", "--input", str(recording), "func_*", "--by", "b")
    assert sorted(maps(globbed.stdout)) == sorted([*maps(by_b.stdout), "@count[-]: 30"])


def test_hist_of_a_recording_is_the_live_hist(loop: Path, recording: Path) -> None:
    live = probescope("hist", "-q", entry(loop), "--of", "a", "-c", f"{loop} {ROUNDS}")
    offline = probescope("hist", "-q", "--input", str(recording), "func_2", "--of", "a")
    assert maps(offline.stdout) == maps(live.stdout)
    buckets = [re.search(r"[\])]\s+(\d+) \|", line) for line in maps(offline.stdout)[1:]]
    assert sum(int(b[1]) for b in buckets if b) == ROUNDS
    linear = probescope(
        "hist", "-q", "--input", str(recording), "func_2__return", "--of", "retval",
        "--linear", "0,3000,1000",
    )  # fmt: skip
    live_linear = probescope(
        "hist", "-q", f"r:{loop}:func_2", "--of", "retval",
        "--linear", "0,3000,1000", "-c", f"{loop} {ROUNDS}",
    )  # fmt: skip
    assert maps(linear.stdout)[1:] == maps(live_linear.stdout)[1:]
    # entries hold no return value: counted and named as the user named it
    every = probescope("hist", "--input", str(recording), "func_2*", "--of", "retval")
    assert f"events without argument retval: {ROUNDS}" in every.stderr


def test_latency_of_a_recording_pairs_as_the_live_latency(loop: Path, recording: Path) -> None:
    live = probescope("latency", "-q", f"{loop}:func_2", "-c", f"{loop} {ROUNDS}")
    offline = probescope("latency", "-q", "--input", str(recording), "func_2")
    stats = [line for line in maps(offline.stdout) if "_stats" in line]
    live_stats = [line for line in maps(live.stdout) if "_stats" in line]
    assert len(stats) == len(live_stats) == 1
    assert stats[0].startswith("@latency_us_stats: count 30, ")
    assert live_stats[0].startswith("@latency_us_stats: count 30, ")
    by_retval = probescope(
        "latency", "-q", "--input", str(recording), "func_2__return", "--by", "retval"
    )
    counts = [line for line in maps(by_retval.stdout) if "_stats[" in line]
    assert len(counts) == ROUNDS
    assert all(re.search(r"\]: count 1, ", line) for line in counts)


def test_bad_input_exits_2_without_a_traceback(loop: Path, recording: Path) -> None:
    nothing = probescope("count", "--input", str(recording), "func_3", check=False)
    assert nothing.returncode == 2
    assert "no recorded event is named 'func_3'" in nothing.stderr
    assert "func_2, func_2__return, named" in nothing.stderr
    assert "Traceback" not in nothing.stderr
    live_option = probescope("count", "--input", str(recording), "-c", str(loop), check=False)
    assert live_option.returncode == 2
    assert "-c cannot be used with --input" in live_option.stderr
    assert "Traceback" not in live_option.stderr
    several = probescope(
        "hist", "--input", str(recording), "-i", "1", "-d", "2", "--of", "a", check=False
    )
    assert several.returncode == 2 and "-d cannot be used with --input" in several.stderr
    both = probescope("count", "--input", str(recording), "-d", "2", "--engine", "bpf", check=False)
    assert both.returncode == 2 and "--engine, -d cannot be used with --input" in both.stderr
    probe = probescope("count", "--input", str(recording), f"{loop}:func_2", check=False)
    assert probe.returncode == 2 and "not a probe" in probe.stderr
    unpaired = probescope("latency", "--input", str(recording), "named", check=False)
    assert unpaired.returncode == 2 and "no return events of named" in unpaired.stderr
    stacks = probescope("stacks", "--input", str(recording), "func_2", check=False)
    assert stacks.returncode == 2 and "Traceback" not in stacks.stderr
    assert "holds no user stacks" in stacks.stderr and "record --stack" in stacks.stderr
    argument = probescope("count", "--input", str(recording), "--by", "size", check=False)
    assert argument.returncode == 2 and "argument named 'size'" in argument.stderr


@pytest.mark.skipif(TRACE_CMD is None, reason="trace-cmd is not installed")
def test_a_file_trace_cmd_wrote_is_counted_as_trace_cmd_reports_it(
    loop: Path, tmp_path: Path
) -> None:
    """trace-cmd's file of a private instance (support.tracefs.trace_cmd_recording)."""
    assert TRACE_CMD is not None
    definitions = [
        d for d in probescope("resolve", entry(loop), f"r:{loop}:func_2 ret=retval:s64").stdout
        .splitlines() if d.strip()
    ]  # fmt: skip
    names = ["func_2", "func_2__return"]
    out = tmp_path / "tc.dat"
    trace_cmd_recording(
        TRACE_CMD,
        out,
        dict(zip(names, definitions, strict=True)),
        [str(loop), "15"],
        tag="psagg",
        settings={"trace_clock": "mono"},
    )
    theirs = subprocess.run(
        [TRACE_CMD, "report", str(out)], capture_output=True, text=True, check=True
    ).stdout
    reported = Counter(
        name for name in re.findall(r":\s+(func_2(?:__return)?):", theirs) if name in names
    )
    assert reported == {"func_2": 15, "func_2__return": 15}
    counted = probescope("count", "-q", "--input", str(out))
    assert sorted(maps(counted.stdout)) == sorted(
        f"@count[{name}]: {n}" for name, n in reported.items()
    )
    latency = probescope("latency", "-q", "--input", str(out), "func_2")
    assert "@latency_us_stats: count 15, " in latency.stdout
