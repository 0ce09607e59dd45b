"""The `probescope` command as a user runs it: outputs, exit codes, error carets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.build import compile_program
from support.tracefs import skip_reason

LOOP = Path(__file__).parents[1] / "targets" / "loop.c"


def probescope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probescope", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def loop() -> Path:
    return compile_program(LOOP.read_text(), "loop", ("-O1", "-g"))


def test_resolve_prints_the_kernel_lines(loop: Path) -> None:
    result = probescope("resolve", f"{loop}:func_1 a=arg1:s32", f"r:{loop}:func_2 ret=retval:s64")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first.startswith(f"p:uprobes/func_1 {loop}:0x0000000000")
    assert first.endswith(" a=%di:s32")
    assert second.startswith(f"r:uprobes/func_2__return {loop}:0x0000000000")
    assert second.endswith(" ret=$retval:s64")


def test_bad_spec_exits_2_with_a_caret(loop: Path) -> None:
    result = probescope("resolve", f"{loop}:func_1 %rax")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: invalid register name '%rax'"
    assert lines[2].index("^") == lines[1].index("%rax")
    assert lines[3].startswith("hint: ") and "%ax" in lines[3]
    assert "Traceback" not in result.stderr


def caret_under(stderr: str, spec: str) -> list[str]:
    """For each `error:` block of one spec, the text from its caret on."""
    lines = stderr.splitlines()
    found = []
    for i, line in enumerate(lines[:-2]):
        if line.startswith("error: ") and lines[i + 1] == f"  {spec}" and "^" in lines[i + 2]:
            found.append(spec[lines[i + 2].index("^") - 2 :])
    return found


def test_a_friendly_argument_error_points_at_what_the_user_typed() -> None:
    result = probescope("resolve", "c:malloc size=arg1:u65")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown type 'u65'\n")
    assert caret_under(result.stderr, "c:malloc size=arg1:u65") == ["u65"]
    assert "%di" not in result.stderr and "Traceback" not in result.stderr


def test_an_argument_error_is_reported_even_when_the_binary_does_not_exist() -> None:
    spec = "nosuchlib:malloc size=(arg1"
    result = probescope("resolve", spec)
    assert result.returncode == 2
    assert result.stderr.count("error: ") == 2
    assert "error: invalid fetch argument '(arg1'" in result.stderr
    assert "nosuchlib" in result.stderr.split("\n", 3)[3]  # the missing binary, after it
    assert caret_under(result.stderr, spec) == ["(arg1", spec]


def test_lowering_errors_point_at_the_users_argument(loop: Path) -> None:
    from unit.symbols.symbol_programs import objdump_instructions

    first, second = objdump_instructions(loop, "func_1")[:2]
    inside = f"{loop}:func_1+{second - first} x=+8(arg9):u32"
    entry = f"{loop}:func_1 n=+0(retval):s32"
    result = probescope("resolve", inside, entry)
    assert result.returncode == 2
    assert "arg9 is passed on the stack" in result.stderr
    assert "retval is only available in a return probe" in result.stderr
    assert caret_under(result.stderr, inside) == ["arg9):u32"]
    assert caret_under(result.stderr, entry) == ["retval):s32"]


def test_unknown_symbol_names_close_ones(loop: Path) -> None:
    result = probescope("resolve", f"{loop}:func_3")
    assert result.returncode == 2
    assert "func_1" in result.stderr or "func_2" in result.stderr


def test_several_errors_are_all_reported(loop: Path) -> None:
    result = probescope("resolve", f"{loop}:nope", "bash:readline%ret", "t:sched")
    assert result.returncode == 2
    assert result.stderr.count("error: ") == 3


@pytest.mark.root
def test_dry_run_writes_nothing(loop: Path) -> None:
    if skip_reason():
        pytest.skip(skip_reason())
    before = Path("/sys/kernel/tracing/uprobe_events").read_text()
    result = probescope(
        "trace", "--dry-run", f"{loop}:func_1 a=arg1:s32", "t:sched:sched_switch", "c:malloc"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("p:uprobes/func_1 ")
    assert lines[1] == "sched:sched_switch"
    assert lines[2].startswith("p:uprobes/malloc ")
    assert Path("/sys/kernel/tracing/uprobe_events").read_text() == before


def test_symbols_lists_functions_with_offsets(loop: Path) -> None:
    result = probescope("symbols", str(loop), "func_*")
    assert result.returncode == 0, result.stderr
    assert "func_1" in result.stdout and "func_2" in result.stdout


def test_engines_says_what_runs_here() -> None:
    result = probescope("engines")
    assert "tracefs" in result.stdout and "ptrace" in result.stdout


def test_version_and_help() -> None:
    assert probescope("--version").stdout.startswith("probescope ")
    assert "trace" in probescope("--help").stdout


@pytest.mark.root
def test_jsonl_output_to_a_file(loop: Path, tmp_path: Path) -> None:
    if skip_reason():
        pytest.skip(skip_reason())
    import json

    out = tmp_path / "events.jsonl"
    result = probescope(
        "trace", "-q", "-f", "jsonl", "-o", str(out), "-c", f"{loop} 3", f"{loop}:func_1 a=arg1:s32"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["args"]["a"] for r in records] == [0, 1, 2]
    assert {r["event"] for r in records} == {"func_1"}
    assert all(r["kind"] == "uprobe" and r["comm"] == "loop" for r in records)


@pytest.mark.parametrize("command", ["resolve", "symbols"])
def test_symbol_commands_import_no_engine(command: str, loop: Path) -> None:
    """`resolve` and `symbols` answer from the symbol layer: loading the engines, the session
    and rich would triple their start-up time."""
    words = [command, f"{loop}:func_1"] if command == "resolve" else [command, str(loop)]
    script = (
        "import sys\n"
        "from probescope.cli.main import main\n"
        f"status = main({words!r})\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('rich', 'probescope.session', "
        "'probescope.engines.base', 'probescope.engines.tracefs.tracefs', 'capstone')))\n"
        "print(status, heavy, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.stderr.splitlines()[-1] == "0 []", result.stderr


@pytest.mark.parametrize("command", ["trace", "resolve", "symbols", "list", "engines", "cleanup"])
def test_every_command_still_parses_its_options(command: str) -> None:
    result = probescope(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: probescope {command}")
    assert "options:" in result.stdout
