"""`probescope stacks --input FILE`, `count --input FILE --by ustack` and `-i` over recorded
time, against the live commands on the same program.

A program with known call paths to one probed function is recorded with `record --stack`;
the recording's stacks must name the same functions with the exact hits per path that live
`stacks --engine tracefs` counts (the same frames as its frame-pointer walk, the program's part
of its CFI walk), also from a copy of the file once the binary is gone. Bursts of calls give
the per-interval counts of `-i`. Nothing is left in tracefs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from integration.tracefs_engine.conftest import target
from support.build import compile_program
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
BURSTS = 3
GAP_MS = 300
FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer")
PER_BURST = {  # the program's call paths to leaf, root first, and their calls per burst
    "main;path_a;leaf": 3,
    "main;path_b;leaf": 2,
    "main;path_b;path_a;leaf": 2,
    "main;path_c;leaf": 1,
}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = target("stack_paths", FLAGS)
    copy = tmp_path_factory.mktemp("program") / "stack_paths"
    shutil.copy2(built, copy)
    return copy


@pytest.fixture(scope="module")
def recording(program: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recording") / "stacks.dat"
    probescope(
        "record", "-q", "--stack", "-o", str(out),
        "-c", f"{program} {BURSTS} {GAP_MS}", f"{program}:leaf",
    )  # fmt: skip
    return out


def folded(text: str) -> dict[str, int]:
    lines = (line.rsplit(" ", 1) for line in text.splitlines() if line.strip())
    return {stack: int(n) for stack, n in lines}


def from_main(stacks: dict[str, int]) -> dict[str, int]:
    """The program's part of each folded stack: from main to the leaf."""
    cut: dict[str, int] = {}
    for stack, n in stacks.items():
        frames = stack.split(";")
        key = ";".join(frames[frames.index("main") :]) if "main" in frames else stack
        cut[key] = cut.get(key, 0) + n
    return cut


def stacks_file(tmp_path: Path, *args: str) -> dict[str, int]:
    out = tmp_path / f"{len(list(tmp_path.iterdir()))}.folded"
    probescope("stacks", "-q", *args, "-o", str(out))
    return folded(out.read_text())


def test_stacks_of_a_recording_are_the_live_stacks(
    program: Path, recording: Path, tmp_path: Path
) -> None:
    offline = stacks_file(tmp_path, "--input", str(recording))
    expected = {stack: n * BURSTS for stack, n in PER_BURST.items()}
    assert from_main(offline) == expected
    command = f"{program} {BURSTS} {GAP_MS}"
    by_frame_pointers = stacks_file(
        tmp_path, "--engine", "tracefs", "--stack-method", "fp", "-c", command,
        f"{program}:leaf",
    )  # fmt: skip
    assert offline == by_frame_pointers
    by_cfi = stacks_file(tmp_path, "--engine", "tracefs", "-c", command, f"{program}:leaf")
    assert from_main(by_cfi) == expected


def test_the_report_prints_what_the_live_trace_prints(program: Path, recording: Path) -> None:
    """The return address `record --stack` fetches for itself (__ps_ret) is in the file (trace-cmd
    prints it) but not in probescope's report, which prints what `trace --stack` prints."""
    text = probescope("report", "-q", str(recording)).stdout
    entries = [line for line in text.splitlines() if ": leaf: (0x" in line]
    assert len(entries) == BURSTS * sum(PER_BURST.values())
    assert all(line.endswith(")") for line in entries), entries[0]
    assert text.count("<user stack trace>") == len(entries)
    record = json.loads(probescope("report", "-q", "-f", "jsonl", str(recording)).stdout.split()[0])
    assert record["event"] == "leaf" and record["args"] == {}
    live = probescope(
        "trace", "--engine", "tracefs", "--stack", "-c", f"{program} 1 0", f"{program}:leaf"
    ).stdout
    assert next(line for line in live.splitlines() if ": leaf: (0x" in line).endswith(")")


def test_text_json_and_svg_of_recorded_stacks(recording: Path, tmp_path: Path) -> None:
    text = probescope("stacks", "-q", "--input", str(recording)).stdout
    # main's call sites: path_a's loop unrolled 3x, path_b's 2x (leaf directly, via path_a)
    assert text.count("@stacks[") == 3 + 2 * 2 + 1
    assert "    path_b+" in text and "    leaf\n" in text
    document = json.loads(
        probescope("stacks", "-q", "--input", str(recording), "-f", "json").stdout.splitlines()[0]
    )
    assert document["type"] == "map"
    svg = tmp_path / "flame.svg"
    probescope("stacks", "-q", "--input", str(recording), "-o", str(svg))
    assert svg.read_text().startswith("<?xml") and "path_c" in svg.read_text()


def test_recorded_stacks_need_no_binaries(program: Path, recording: Path, tmp_path: Path) -> None:
    before = stacks_file(tmp_path, "--input", str(recording))
    moved = tmp_path / "elsewhere.dat"
    shutil.copy2(recording, moved)
    hidden = program.with_name("stack_paths.gone")
    program.rename(hidden)
    try:
        assert stacks_file(tmp_path, "--input", str(moved)) == before
    finally:
        hidden.rename(program)


def test_count_by_ustack_agrees_with_stacks(recording: Path) -> None:
    stacks = probescope("stacks", "-q", "--input", str(recording)).stdout
    counted = probescope("count", "-q", "--input", str(recording), "--by", "ustack").stdout
    assert counted.replace("@count[", "@stacks[") == stacks
    assert sum(int(n) for n in _values(counted)) == BURSTS * sum(PER_BURST.values())


def _values(text: str) -> list[str]:
    return [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("]: ")]


def intervals(stdout: str) -> list[list[str]]:
    """The lines printed per interval (each interval starts with its stamp line)."""
    found: list[list[str]] = []
    for line in stdout.splitlines():
        if line and line[0].isdigit():
            found.append([])
        elif line.strip() and found:
            found[-1].append(line)
    return found


def test_intervals_of_recorded_time_count_the_bursts(recording: Path) -> None:
    burst = sum(PER_BURST.values())
    result = probescope("count", "-q", "--input", str(recording), "-i", f"{GAP_MS / 1000}")
    assert intervals(result.stdout) == [[f"@count[leaf]: {burst}"]] * BURSTS
    stacks = probescope("stacks", "-q", "--input", str(recording), "-i", "0.3").stdout
    assert [sum(int(n) for n in _values("\n".join(i))) for i in intervals(stacks)] == [
        burst
    ] * BURSTS


def test_an_empty_interval_prints_as_live(program: Path, tmp_path: Path) -> None:
    out = tmp_path / "gaps.dat"
    probescope("record", "-q", "-o", str(out), "-c", f"{program} 3 700", f"{program}:leaf")
    result = probescope("count", "-q", "--input", str(out), "-i", "0.3")
    burst = f"@count[leaf]: {sum(PER_BURST.values())}"
    printed = intervals(result.stdout)
    assert [lines for lines in printed if lines] == [[burst]] * 3
    assert printed[0] == [burst] and len(printed) == 5  # bursts at 0, ~0.7 and ~1.4 s
    live = probescope("count", "-q", "-i", "0.2", "-c", f"{program} 2 700", f"{program}:leaf")
    assert [] in intervals(live.stdout)  # live prints an empty interval as a bare stamp too


def test_a_recording_without_stacks_says_how_to_record_them(
    program: Path, recording: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plain.dat"
    probescope("record", "-q", "-o", str(out), "-c", f"{program} 1", f"{program}:leaf")
    for command in (("stacks",), ("count", "--by", "ustack")):
        refused = probescope(*command, "--input", str(out), check=False)
        assert refused.returncode == 2
        assert "the recording holds no user stacks" in refused.stderr
        assert "hint: record user stacks with the events: probescope record --stack" in (
            refused.stderr
        )
    kernel = probescope("count", "--input", str(recording), "--by", "kstack", check=False)
    assert kernel.returncode == 2 and "no kernel stacks" in kernel.stderr
    live_only = probescope("stacks", "--input", str(recording), "-d", "1", check=False)
    assert live_only.returncode == 2 and "-d cannot be used with --input" in live_only.stderr


@pytest.mark.parametrize("engine", ["ptrace", "bpf", "fentry"])
def test_engines_without_stack_records_refuse_record_stack(
    engine: str, program: Path, tmp_path: Path
) -> None:
    out = tmp_path / "refused.dat"
    refused = probescope(
        "record", "-q", "--stack", "--engine", engine, "-o", str(out),
        "-c", f"{program} 1", f"{program}:leaf", check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "stack" in refused.stderr and "tracefs" in refused.stderr
    assert not out.exists()


@pytest.mark.skipif(TRACE_CMD is None, reason="trace-cmd is not installed")
def test_user_stacks_of_a_file_trace_cmd_wrote(program: Path, tmp_path: Path) -> None:
    """trace-cmd's file of a private instance with `userstacktrace` set (`trace-cmd record`
    itself enables the function tracer, which this kernel refuses): a stack per hit, its
    frames addresses (trace-cmd keeps no maps), as many as trace-cmd reports."""
    assert TRACE_CMD is not None
    (definition,) = [
        line
        for line in probescope("resolve", f"{program}:leaf").stdout.splitlines()
        if line.strip()
    ]
    out = tmp_path / "tc.dat"
    trace_cmd_recording(
        TRACE_CMD,
        out,
        {"leaf": definition},
        [str(program), "2"],
        tag="psstk",
        settings={"options/userstacktrace": "1"},
    )
    theirs = subprocess.run(
        [TRACE_CMD, "report", str(out)], capture_output=True, text=True, check=True
    ).stdout
    hits = 2 * sum(PER_BURST.values())
    assert len(re.findall(r": leaf:", theirs)) == hits
    # trace-cmd prints each stack record as `=> 0x...` lines, the kernel's zero fill included
    reported: dict[str, int] = {}
    for record in re.split(r"\n(?=\S)", theirs):
        frames = [f for f in re.findall(r"=> (0x[0-9a-f]+)", record) if f != "0x0"]
        if frames:
            stack = ";".join(reversed(frames))
            reported[stack] = reported.get(stack, 0) + 1
    stacks = stacks_file(tmp_path, "--input", str(out))
    assert sum(stacks.values()) == hits
    assert stacks == reported


SHORT = r"""
#include <stdlib.h>
void *volatile kept;
int main(void)
{
    for (int i = 0; i < 5; i++)
        kept = malloc(100 + i);  /* kept: the compiler may not drop the call */
    return 0;
}
"""


def test_a_command_shorter_than_the_sampling_keeps_its_libraries_maps(tmp_path: Path) -> None:
    """The maps of a command that ends in a millisecond (libc mapped by ld.so after its exec)
    are copied at its exit, so its libc frames are named like the program's."""
    short = compile_program(SHORT, "short_malloc", ("-O1", "-g", "-fno-omit-frame-pointer"))
    out = tmp_path / "short.dat"
    probescope("record", "-q", "--stack", "-o", str(out), "-c", str(short), "c:malloc")
    text = probescope("stacks", "-q", "--input", str(out), "-f", "json").stdout
    document = json.loads(text.splitlines()[0])
    stacks = {tuple(key.split()): n for key, n in document["data"]["@stacks"].items()}
    ours = {frames: n for frames, n in stacks.items() if "main+" in " ".join(frames)}
    assert sum(ours.values()) == 5, stacks
    assert all(frames[0] == "malloc" for frames in ours), ours
