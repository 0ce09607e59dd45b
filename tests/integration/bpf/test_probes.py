"""The bpf engine on programs the tests build and on system binaries: the same events and
values as the tracefs engine (strings on pages the program never touched, USDT semaphores,
Python's own SDT probes, libc), the uprobe PMU fallback, children of `-p` processes, lost
records counted, unsafe offsets refused, and what a verifier rejection looks like."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from integration.bpf.harness import args_by_event, trace
from probescope.engines.base import EngineOptions, Target
from probescope.engines.bpf import engine as engine_module
from probescope.engines.bpf.engine import BpfEngine
from probescope.engines.bpf.insn import Reg, ldx
from probescope.errors import SpecError, VerifierError
from probescope.events import EventBatch
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.session import Session
from probescope.symbols.resolve import resolve_specs
from probescope.symbols.table import SymbolTable

pytestmark = pytest.mark.root

TARGETS = Path(__file__).parents[2] / "targets"
PYTHON = Path("/usr/bin/python3.11")


def same_as_tracefs(specs: list[str], argv: list[str]) -> dict[str, list[tuple[object, ...]]]:
    kernel, _ = trace("tracefs", specs, argv)
    ours, summary = trace("bpf", specs, argv)
    assert summary.engine == "bpf" and summary.lost == 0
    assert args_by_event(ours) == args_by_event(kernel)
    return args_by_event(ours)


def test_a_string_on_a_page_the_program_never_touched(values: Path, no_aslr: Path) -> None:
    found = same_as_tracefs(
        [f"{values}:corpus_probe text=+0(arg2):string n=arg3:s64"], [str(no_aslr), str(values)]
    )
    assert found["corpus_probe"] == [
        ("a literal never read by the program", 0),
        ("a literal never read by the program", 1),
    ]


def test_usdt_semaphores_and_arguments(build: Callable[..., Path]) -> None:
    gated = build((TARGETS / "usdt" / "usdt_gated.c").read_text(), "usdt_gated", ("-O2", "-g"))
    specs = [f"usdt:{gated}:gated:hit", f"usdt:{gated}:gated:always v=arg1"]
    events, _ = trace("bpf", specs, [str(gated), "4"])
    kernel, _ = trace("tracefs", specs, [str(gated), "4"])
    assert args_by_event(events) == args_by_event(kernel)
    assert len([e for e in events if e.name == "gated_hit"]) == 4, "the semaphore was raised"
    assert all(e.kind is ProbeKind.USDT for e in events)
    after = subprocess.run([str(gated), "1"], capture_output=True, text=True, check=True).stdout
    assert "semaphore 0 0" in after, "and lowered again"


@pytest.mark.skipif(not PYTHON.exists(), reason="Debian's python3.11 (with SDT probes) is absent")
def test_python_import_probes_with_strings() -> None:
    spec = f"usdt:{PYTHON}:python:import__find__load__done module=arg1:string found=arg2"
    found = same_as_tracefs([spec], [str(PYTHON), "-c", "import json, colorsys"])
    modules = [args[0] for args in found["python_import__find__load__done"]]
    assert "json" in modules and "colorsys" in modules


def test_libc_and_bash() -> None:
    same_as_tracefs(
        ["c:getenv name=+0(arg1):string", "r:c:getenv value=+0(retval):string"],
        ["/bin/bash", "-c", "true"],
    )


def test_uprobe_pmu_fallback_gives_the_same_events(values: Path) -> None:
    """(Not strings on pages the program has yet to touch: programs attached through perf
    events cannot sleep to fault them in, so those read as faults on the PMU path.)"""
    specs = [f"{values}:filter_probe n=arg1:s32", f"r:{values}:corpus_probe"]
    found = {}
    for mode in ("multi", "pmu"):
        engine = BpfEngine(attach_mode=mode)
        engine.attach(resolve_specs(specs), Target(command=(str(values),)))
        events = [
            (e.name, e.args, e.ret_ip is not None)
            for item in engine.events()
            for e in (item.events if isinstance(item, EventBatch) else [item])
        ]
        stats = engine.stats()
        engine.detach()
        found[mode] = events
        assert stats.extra["perf_events" if mode == "pmu" else "links"] >= 2
    assert found["pmu"] == found["multi"]
    assert len(found["pmu"]) == 9


def test_children_of_a_pid_are_followed(build: Callable[..., Path]) -> None:
    forks = build((TARGETS / "forks.c").read_text(), "forks", ("-O0", "-g"))
    gate = subprocess.Popen(
        ["sh", "-c", f'read line; exec "{forks}"'], stdin=subprocess.PIPE, text=True
    )
    session = Session([f"{forks}:step g=arg1:s32"], engine="bpf", pids=[gate.pid])
    with session:
        assert gate.stdin is not None
        gate.stdin.write("go\n")
        gate.stdin.close()
        events = list(session.events(duration=30))
    gate.wait(timeout=30)
    assert sorted(e.arg("g") for e in events) == [0, 1, 2]
    assert len({e.pid for e in events}) == 3


def test_lost_records_are_counted_never_hidden(build: Callable[..., Path]) -> None:
    source = """
    __attribute__((noinline)) long hit(long i) { return i; }
    int main(void) { long s = 0; for (long i = 0; i < 300000; i++) s += hit(i); return s == 1; }
    """
    burst = build(source, "burst", ("-O1",))
    session = Session(
        [f"{burst}:hit i=arg1:s64"],
        engine="bpf",
        command=[str(burst)],
        options=EngineOptions(buffer_size_kb=4),
    )
    with session:
        received = sum(1 for _ in session.events(duration=60))
    summary = session.summary()
    assert summary.lost > 0
    assert received + summary.lost == 300000


def test_offsets_inside_an_instruction_are_refused(values: Path) -> None:
    function = SymbolTable.for_path(values).lookup("filter_probe")
    # filter_probe starts `push %rbp` (1 byte), `mov %rsp,%rbp` (3 bytes): +2 is inside
    spec = parse_kernel_probe(f"p:g/inside {values}:{function.offset + 2:#x}")
    assert isinstance(spec, ProbeSpec)
    raw = ResolvedProbe.from_uprobe_spec(spec)
    session = Session(engine="bpf", probes=[raw], command=[str(values)])
    with pytest.raises(SpecError, match="inside the instruction"):
        session.start()


def test_a_verifier_rejection_shows_the_spec_the_arguments_and_the_log(
    values: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        image = build_record_program(*args, **kwargs)  # type: ignore[arg-type]
        bad = ldx(8, Reg.R0, Reg.R7, 1 << 14).encode()  # far past the end of the record
        return type(image)(**{**image.__dict__, "instructions": bad + image.instructions})

    build_record_program = engine_module.build_record_program
    monkeypatch.setattr(engine_module, "build_record_program", broken)
    spec = f"{values}:filter_probe number=arg1:s32"
    session = Session([spec], engine="bpf", command=[str(values)])
    with pytest.raises(VerifierError) as caught:
        session.start()
    text = caught.value.render()
    assert spec in text and "number=%di:s32" in text
    assert "verifier's last lines" in text
    complaint = [line for line in caught.value.log.splitlines() if line.strip()][-2]
    assert complaint in text


def test_trace_command_text(values: Path) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "probescope", "trace", "--engine", "bpf", "-c", str(values)),
            f"{values}:filter_probe n=arg1:s32 w=+0(arg2):string",
            "t:sched:sched_process_exit",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if ": (0x" in line or "exit" in line]
    assert len(lines) == 8, result.stdout
    assert re.match(
        r"^ +values-\d+ +\[\d{3}\] \.\.\.\.\. +\d+\.\d{6}: filter_probe: \(0x[0-9a-f]+\) "
        r'n=-3 w="alpha"$',
        lines[0],
    ), lines[0]
    assert "sched_process_exit: comm=values" in lines[-1]
    assert "(bpf engine, end); lost 0" in result.stderr


def test_text_is_the_tracefs_engines_but_for_the_flags_column(values: Path, no_aslr: Path) -> None:
    """The same events print the same lines; BPF cannot know the irq/preempt flags, so the
    bpf engine's lines read `.....` there (and time and cpu are each run's own)."""
    from io import BytesIO

    from probescope.sinks.base import open_sink

    specs = [
        f"{values}:filter_probe n=arg1:s32 w=+0(arg2):string c=$comm:string",
        f"r:{values}:filter_probe r=retval:s32",
        "t:sched:sched_process_exit",
    ]
    texts = {}
    for engine in ("tracefs", "bpf"):
        out = BytesIO()
        session = Session(specs, engine=engine, command=[str(no_aslr), str(values)])
        session.run([open_sink("text", out)])
        context = re.compile(r"^(\s*\S+)-\d+\s+\[\d{3}\] (.{5}) +\d+\.\d{6}: ")
        lines = out.getvalue().decode().splitlines()
        texts[engine] = [re.sub(r"pid=\d+", "pid=N", context.sub(r"\1 ", line)) for line in lines]
        flags = {match.group(2) for match in map(context.match, lines) if match}
        if engine == "bpf":
            assert flags == {"....."}
    assert texts["bpf"] == texts["tracefs"]
    assert len(texts["bpf"]) == 15


def test_auto_prefers_bpf_and_says_why_it_passes_it_over(values: Path) -> None:
    spec = f"{values}:filter_probe n=arg1:s32"
    chosen = Session([spec], command=[str(values)])
    with chosen:
        assert len(list(chosen.events(duration=30))) == 7
    summary = chosen.summary()
    assert summary.engine == "bpf"
    assert not any(note.startswith("engine auto") for note in summary.stats.notes)  # type: ignore[union-attr]
    fallback = Session([spec], command=[str(values)], options=EngineOptions(clock="global"))
    with fallback:
        assert len(list(fallback.events(duration=30))) == 7
    summary = fallback.summary()
    assert summary.engine == "tracefs"
    notes = summary.stats.notes  # type: ignore[union-attr]
    assert any("passed over bpf" in note and "'global'" in note for note in notes), notes
