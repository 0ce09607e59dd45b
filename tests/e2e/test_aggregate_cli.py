"""`probescope count|hist|latency|stacks` as a user runs them: bpftrace-style output, interval
printing, output files by suffix, exit codes, and errors with carets (no kernel state)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.build import compile_program

WORKLOAD = Path(__file__).parents[1] / "targets" / "aggregate" / "workload.c"


def probescope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probescope", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def workload() -> Path:
    return compile_program(WORKLOAD.read_text(), "workload", ("-O1", "-g", "-pthread"))


def caret_under(stderr: str, text: str) -> None:
    lines = stderr.splitlines()
    index = next(i for i, line in enumerate(lines) if line.endswith("^"))
    assert lines[index].index("^") == lines[index - 1].index(text), stderr
    assert "Traceback" not in stderr


def test_bad_key_list(workload: Path) -> None:
    result = probescope("count", f"{workload}:alpha", "--by", "comm,,pid", "-c", str(workload))
    assert result.returncode == 2
    assert "empty name in --by" in result.stderr
    assert result.stderr.splitlines()[2].index("^") == 7


def test_bad_linear_buckets(workload: Path) -> None:
    result = probescope(
        "hist", f"{workload}:beta", "--of", "arg1", "--linear", "0,ten,1", "-c", str(workload)
    )
    assert result.returncode == 2
    caret_under(result.stderr, "ten")
    result = probescope(
        "hist", f"{workload}:beta", "--of", "arg1", "--linear", "0,10,3", "-c", str(workload)
    )
    assert result.returncode == 2 and "multiple of STEP" in result.stderr


def test_unknown_argument_key(workload: Path) -> None:
    result = probescope("count", f"{workload}:alpha", "--by", "size", "-c", str(workload))
    assert result.returncode == 2
    assert "no probe has an argument named 'size'" in result.stderr


def test_latency_wants_a_function_entry(workload: Path) -> None:
    result = probescope("latency", f"r:{workload}:alpha", "-c", str(workload))
    assert result.returncode == 2
    assert "latency needs a function entry" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.root
def test_count_text_and_exit_status(workload: Path) -> None:
    result = probescope("count", f"{workload}:alpha", f"{workload}:beta", "-c", str(workload))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == ["@count[beta]: 37", "@count[alpha]: 160", ""]
    assert "197 events aggregated" in result.stderr


@pytest.mark.root
def test_interval_printing_clears_values(workload: Path) -> None:
    result = probescope(
        "count", f"{workload}:nap", "-i", "0.3", "-f", "json", "-c", f"{workload} nap 8 100"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    counts = [r["data"]["@count"]["nap"] for r in records if r["type"] == "map"]
    assert sum(counts) == 8
    assert len(counts) >= 2  # 8 naps of 100 ms spread over 300 ms intervals
    assert max(counts) <= 5
    assert sum(r["type"] == "time" for r in records) >= 2


@pytest.mark.root
@pytest.mark.parametrize("engine", ["bpf", "tracefs", "ptrace"])
def test_hist_of_the_return_value(workload: Path, engine: str) -> None:
    """`--of retval` on a return probe needs no argument named retval in the spec."""
    result = probescope(
        "hist", "--engine", engine, f"r:{workload}:beta", "--of", "retval", "-f", "json",
        "-c", f"{workload} hist",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[1])
    buckets = {(b.get("min"), b["max"]): b["count"] for b in record["data"]["@retval"]}
    assert buckets[(64, 127)] == 32  # beta(32..63)
    # beta(-5) returns the int -10: the 64-bit register (as bpftrace's retval) holds 2**32 - 10
    assert buckets[(2**31, 2**32 - 1)] == 3
    assert sum(buckets.values()) == 64 + 3


def test_hist_of_retval_without_a_return_probe(workload: Path) -> None:
    result = probescope("hist", f"{workload}:beta", "--of", "retval", "-c", str(workload))
    assert result.returncode == 2
    assert "--of retval needs a return probe" in result.stderr and "r:c:malloc" in result.stderr


@pytest.mark.root
def test_hist_json(workload: Path) -> None:
    result = probescope(
        "hist", f"{workload}:beta x=arg1:s32", "--of", "x", "-f", "json", "-c", f"{workload} hist"
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[1])
    assert record["type"] == "hist"
    assert record["data"]["@x"][0] == {"max": -1, "count": 3}
    assert record["data"]["@x"][-1] == {"min": 32, "max": 63, "count": 32}


@pytest.mark.root
def test_stacks_to_files(workload: Path, tmp_path: Path) -> None:
    for name in ("out.folded", "out.svg", "out.speedscope.json"):
        result = probescope(
            "stacks", f"{workload}:fib", "-o", str(tmp_path / name), "-c", f"{workload} fib"
        )
        assert result.returncode == 0, result.stderr
        assert f"wrote {tmp_path / name}" in result.stderr
    folded = (tmp_path / "out.folded").read_text().splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded) == 1973
    assert all(line.startswith("_start;__libc_start_main;") for line in folded)
    assert (tmp_path / "out.svg").read_text().startswith("<?xml")
    document = json.loads((tmp_path / "out.speedscope.json").read_text())
    assert document["profiles"][0]["type"] == "sampled"


@pytest.mark.root
def test_latency_evented_profile(workload: Path, tmp_path: Path) -> None:
    path = tmp_path / "fib.speedscope.json"
    result = probescope("latency", f"{workload}:fib", "-o", str(path), "-c", f"{workload} fib")
    assert result.returncode == 0, result.stderr
    assert "@latency_us_stats: count 1973," in result.stdout
    (profile,) = json.loads(path.read_text())["profiles"]
    assert profile["type"] == "evented"
    assert sum(e["type"] == "O" for e in profile["events"]) == 1973


@pytest.mark.root
def test_ctrl_c_prints_the_last_values(workload: Path) -> None:
    import signal
    import time

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "probescope",
            "count",
            f"{workload}:nap",
            "-c",
            f"{workload} nap 100 50",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(2.0)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    (line,) = [line for line in stdout.splitlines() if line.startswith("@count")]
    assert 0 < int(line.split(": ")[1]) < 100
    assert "was still running: terminated" in stderr


def _bpf_reason() -> str | None:
    from probescope.engines.registry import BY_NAME, availability

    state = availability(BY_NAME["bpf"])
    return None if state.ok else state.reason


@pytest.mark.root
def test_the_bpf_engine_aggregates_in_the_kernel_or_says_why_not(workload: Path) -> None:
    reason = _bpf_reason()
    if reason:
        pytest.skip(f"the bpf engine cannot run here: {reason}")
    spec = f"{workload}:beta x=arg1:s32"
    result = probescope("count", spec, "--by", "x", "--engine", "bpf", "-c", f"{workload} hist")
    assert result.returncode == 0, result.stderr
    assert "@count[-5]: 3" in result.stdout.splitlines()
    assert "(bpf engine (aggregated in the kernel), end)" in result.stderr
    filtered = probescope(
        "count", spec, "--filter", "x >= 60", "--engine", "bpf", "-c", f"{workload} hist"
    )
    assert filtered.returncode == 0, filtered.stderr
    assert filtered.stdout.splitlines()[-2:] == ["@count[beta]: 4", ""]
    assert "note: aggregated in user space, not in the kernel: --filter" in filtered.stderr
