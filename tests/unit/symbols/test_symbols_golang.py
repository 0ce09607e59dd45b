"""Go: the toolchain version read from the binary, and `argN` in Go's register ABI."""

from __future__ import annotations

import argparse

import pytest

from probescope.cli import resolve as resolve_command
from probescope.engines.tracefs.engine import TracefsEngine
from probescope.engines.tracefs.session_events import kernel_refusal
from probescope.errors import SpecError
from probescope.language.go_strings import kernel_inexpressible
from probescope.language.model import GoString, ProbeSpec, Register
from probescope.symbols.golang import uses_register_abi
from probescope.symbols.resolve import resolve_specs
from probescope.symbols.table import SymbolTable
from probescope.system.kernel import RunningKernel
from unit.symbols import language_programs as programs
from unit.symbols import symbol_programs


def test_go_version_and_register_abi_come_from_the_binary() -> None:
    binary = programs.go()
    table = SymbolTable.for_path(binary)
    assert table.is_go and table.go_version is not None
    assert table.go_version.startswith("go1.")
    minor = int(table.go_version.split(".")[1])
    assert table.takes_go_registers(table.lookup("main.Add")) == (minor >= 17)
    c_table = SymbolTable.for_path(symbol_programs.demo(pie=True, optimize="-O0"))
    assert not c_table.takes_go_registers(c_table.lookup("ps_add"))


def test_register_abi_by_version_machine_and_abi0_wrappers() -> None:
    assert uses_register_abi("go1.17", 62, "main.f")
    assert not uses_register_abi("go1.16.15", 62, "main.f")
    assert not uses_register_abi("go1.17.3", 183, "main.f")  # arm64: from 1.18
    assert uses_register_abi("go1.18", 183, "main.f")
    assert not uses_register_abi("go1.21.0", 62, "main.f.abi0")
    assert not uses_register_abi(None, 62, "main.f")


def test_argn_follows_gos_register_abi() -> None:
    binary = programs.go()
    if not SymbolTable.for_path(binary).takes_go_registers(
        SymbolTable.for_path(binary).lookup("main.Add")
    ):
        pytest.skip("this Go toolchain predates the register ABI")
    (add, greet) = resolve_specs(
        [
            f"{binary}:main.Add a=arg1:s64 b=arg2:s64",
            f"{binary}:main.Greet name=+0(arg1):char[6] len=arg2:u64 times=arg3:s64 ret=arg9",
        ]
    )
    assert add.spec.definition().endswith(" a=%ax:s64 b=%bx:s64")  # type: ignore[union-attr]
    assert greet.spec.definition().endswith(  # type: ignore[union-attr]
        " name=+0(%ax):char[6] len=%bx:u64 times=%cx:s64 ret=%r11"
    )
    with pytest.raises(SpecError) as raised:
        resolve_specs([f"{binary}:main.Add x=arg10"])
    assert "Go passes the words past its 9 argument registers on the stack" in raised.value.message


def _register_abi(binary: object) -> None:
    table = SymbolTable.for_path(binary)  # type: ignore[arg-type]
    if not table.takes_go_registers(table.lookup("main.Say")):
        pytest.skip("this Go toolchain predates the register ABI")


def test_gostring_is_the_pointer_and_length_of_a_go_function() -> None:
    binary = programs.go()
    _register_abi(binary)
    (say,) = resolve_specs([f"{binary}:main.Say s=arg1:gostring n=arg3:s64"])
    assert isinstance(say.spec, ProbeSpec)
    s, n = say.spec.args
    assert s.fetch == GoString(Register("ax"), Register("bx")) and s.type.is_string
    assert n.fetch == Register("cx")
    assert kernel_inexpressible(say.spec.args) == [s]


def test_gostring_is_refused_on_a_c_function_with_a_caret_at_the_type() -> None:
    text = f"{symbol_programs.demo(pie=True, optimize='-O0')}:ps_add s=arg1:gostring"
    with pytest.raises(SpecError) as raised:
        resolve_specs([text])
    assert "Go's register ABI" in raised.value.message
    column = raised.value.column
    assert column is not None and text[column:] == "gostring"


def test_no_uprobe_events_line_carries_a_gostring(capsys: pytest.CaptureFixture[str]) -> None:
    """`resolve` prints the line without it and says why in a comment; the tracefs engine
    refuses the probe by name, before touching anything."""
    binary = programs.go()
    _register_abi(binary)
    spec = f"{binary}:main.Say s=arg1:gostring n=arg3:s64"
    assert resolve_command.run(argparse.Namespace(specs=[spec], pid=None, verbose=False)) == 0
    line, comment = capsys.readouterr().out.splitlines()
    assert line.startswith("p:uprobes/main_Say ")
    assert line.endswith(" n=%cx:s64") and "gostring" not in line
    assert comment.startswith("# s=arg1:gostring: a Go string, pointer %ax and length %bx;")
    assert "--engine bpf or --engine ptrace" in comment
    probes = resolve_specs([spec])
    refusal = TracefsEngine(kernel=RunningKernel.read()).unsupported(probes)
    assert refusal is not None
    assert refusal.startswith("main.Say: s=arg1:gostring: uprobe_events reads a string up to")
    assert kernel_refusal(resolve_specs([f"{binary}:main.Say n=arg3:s64"])) is None
