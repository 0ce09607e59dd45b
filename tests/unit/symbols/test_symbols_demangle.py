"""Demangled names: spelled as binutils does, accepted wherever a symbol is, globs over them.

The targets are real: libstdc++'s own symbols against `c++filt -i`, a g++-built program with
overloads, templates and an operator, and one Rust program built with legacy and v0 mangling.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from probescope.cli.main import build_parser
from probescope.cli.symbols import run as symbols_run
from probescope.errors import SpecError, SymbolError
from probescope.language.parse import parse_probe
from probescope.symbols.demangle import (
    demangle,
    function_path,
    squeeze,
    without_template_arguments,
)
from probescope.symbols.resolve import resolve_specs
from probescope.symbols.table import SymbolTable, clear_memory_cache
from unit.symbols import language_programs as programs
from unit.symbols import symbol_programs

LIBSTDCXX = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")


def _cxxfilt(names: list[str]) -> list[str]:
    out = subprocess.run(
        ["c++filt", "-i"], input="\n".join(names) + "\n", capture_output=True, text=True
    )
    return out.stdout.splitlines()


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt (binutils)")
@pytest.mark.skipif(not LIBSTDCXX.exists(), reason="needs libstdc++6")
def test_every_libstdcxx_function_is_spelled_as_binutils_does() -> None:
    table = SymbolTable.for_path(LIBSTDCXX)
    names = sorted({n for f in table.functions for n in f.names if n.startswith("_Z")})
    assert len(names) > 3000
    plain = [n.split("@", 1)[0] for n in names]
    expected = _cxxfilt(plain)
    wrong = [(n, e, demangle(n)) for n, e in zip(plain, expected, strict=True) if demangle(n) != e]
    assert wrong == []
    versioned = next(n for n in names if "@@" in n)
    assert (
        demangle(versioned)
        == _cxxfilt([versioned.split("@")[0]])[0] + "@@" + versioned.split("@@")[1]
    )


def test_names_that_are_not_mangled_stay_as_they_are() -> None:
    assert demangle("malloc") is None
    assert demangle("_start") is None
    assert demangle("_Z") is None
    assert demangle("_Zgarbage") is None


@pytest.mark.parametrize(
    "text, path",
    [
        ("ns::Class::method(int)", "ns::Class::method"),
        ("int ns::add<int>(int, int)", "ns::add<int>"),
        ("std::istream::gcount() const", "std::istream::gcount"),
        ("operator new(unsigned long)", "operator new"),
        ("ns::A::operator bool() const", "ns::A::operator bool"),
        ("std::ostream::operator<<(int)", "std::ostream::operator<<"),
        ("ns::Class::operator()(int) &&", "ns::Class::operator()"),
        ("std::ctype<char>::do_widen(char) const [clone .cold]", "std::ctype<char>::do_widen"),
        ("<a::S as a::T>::area", "<a::S as a::T>::area"),
        ("a::total::<a::S>", "a::total::<a::S>"),
    ],
)
def test_function_path(text: str, path: str) -> None:
    assert function_path(text) == path


def test_template_arguments_and_spacing() -> None:
    assert without_template_arguments("ns::add<int>") == "ns::add"
    assert without_template_arguments("a::total::<a::S>") == "a::total"
    assert without_template_arguments("std::operator<< <std::char_traits<char> >") == (
        "std::operator<<"
    )
    assert without_template_arguments("ns::operator>") == "ns::operator>"
    assert squeeze("f(int, char const*)") == "f(int,char const*)"
    assert squeeze("v<int, a<int> >") == squeeze("v<int,a<int>>")
    assert squeeze("unsigned  int") == "unsigned int"


@pytest.fixture(scope="module")
def cpp() -> Path:
    return programs.cpp()


def test_cpp_functions_by_demangled_name(cpp: Path) -> None:
    table = SymbolTable.for_path(cpp)
    method = table.lookup("ns::Class::method(int)")
    assert method.name == "_ZN2ns5Class6methodEi"
    assert table.demangled_name(method) == "ns::Class::method(int)"
    assert table.lookup("  ns::Class::method( int )") == method
    assert table.lookup("_ZN2ns5Class6methodEi") == method
    assert table.lookup("ns::Class::twice").name.startswith("_ZN2ns5Class5twice")
    twice = "ns::Class::twice(std::__cxx11::basic_string<char,std::char_traits<char>,"
    assert table.lookup(twice + "std::allocator<char>>const&,int)") == table.lookup(
        "ns::Class::twice"
    )
    assert table.lookup("ns::add<long>").name == "_ZN2ns3addIlEET_S1_S1_"
    assert table.lookup("long ns::add<long>(long, long)").name == "_ZN2ns3addIlEET_S1_S1_"
    assert table.lookup("ns::Class::operator+=(int)").name == "_ZN2ns5ClasspLEi"


def test_overloads_are_ambiguous_and_listed(cpp: Path) -> None:
    table = SymbolTable.for_path(cpp)
    with pytest.raises(SymbolError) as raised:
        table.lookup("ns::Class::method")
    message = raised.value.message
    assert "2 functions" in message
    assert "ns::Class::method(int) at 0x" in message and "ns::Class::method(double)" in message
    assert "ns::Class::method*" in (raised.value.hint or "")
    with pytest.raises(SymbolError) as raised:
        table.lookup("ns::add")
    assert "int ns::add<int>(int, int)" in raised.value.message


def test_a_misspelt_name_gets_demangled_suggestions(cpp: Path) -> None:
    with pytest.raises(SymbolError) as raised:
        SymbolTable.for_path(cpp).lookup("ns::Class::methd")
    assert "did you mean ns::Class::method" in (raised.value.hint or "")


def test_globs_over_demangled_names(cpp: Path) -> None:
    table = SymbolTable.for_path(cpp)

    def names(pattern: str) -> set[str]:
        return {table.demangled_name(f) for f in table.match(pattern)}

    assert names("ns::Class::*") == {
        "ns::Class::method(int)",
        "ns::Class::method(double)",
        "ns::Class::twice(std::__cxx11::basic_string<char, std::char_traits<char>, "
        "std::allocator<char> > const&, int)",
        "ns::Class::operator+=(int)",
    }
    assert names("ns*") == names("ns::Class::*") | {
        "int ns::add<int>(int, int)",
        "long ns::add<long>(long, long)",
    }
    assert names("ns::add*") == {"int ns::add<int>(int, int)", "long ns::add<long>(long, long)"}
    assert names("*method(int, *") == set()
    assert names("ns::Class::method(*)") == {"ns::Class::method(int)", "ns::Class::method(double)"}
    assert names("_ZN2ns5Class6method*") == {"ns::Class::method(int)", "ns::Class::method(double)"}
    assert len(table.match("ma*")) == 1  # a C name in the same program


def test_demangled_names_live_in_the_symbol_cache(cpp: Path) -> None:
    first = SymbolTable.for_path(cpp)
    first.lookup("ns::Class::method(int)")
    clear_memory_cache()
    again = SymbolTable.for_path(cpp)
    assert again.from_cache and again._demangled is not None
    assert again.lookup("ns::Class::method(int)").name == "_ZN2ns5Class6methodEi"


def test_c_tables_build_no_demangled_names() -> None:
    table = SymbolTable.for_path(symbol_programs.demo(pie=True, optimize="-O0"))
    assert not table.demangled
    with pytest.raises(SymbolError, match="no function 'ns::f'"):
        table.lookup("ns::f")


@pytest.mark.parametrize("mangling", ["legacy", "v0"])
def test_rust_functions_by_demangled_name(mangling: str) -> None:
    binary = programs.rust(mangling)
    crate = f"rust_{mangling}"
    table = SymbolTable.for_path(binary)
    add = table.lookup(f"{crate}::add")
    assert add.name.startswith("_ZN" if mangling == "legacy" else "_R")
    assert table.demangled_name(add) == f"{crate}::add"
    area = table.lookup(f"<{crate}::shapes::Square as {crate}::shapes::Area>::area")
    assert table.demangled_name(area).endswith("::area")
    total = table.lookup(f"{crate}::shapes::total")
    assert table.demangled_name(total).startswith(f"{crate}::shapes::total")
    matched = {table.demangled_name(f) for f in table.match(f"{crate}::shapes::*")}
    assert f"{crate}::shapes::total" in {function_path(m).split("::<")[0] for m in matched}


def test_friendly_specs_take_demangled_names_with_spaces_and_operators(cpp: Path) -> None:
    probe = parse_probe(f"p:g/e {cpp}:ns::Class::twice(std::string const&, int) n=arg2:s32")
    assert probe.symbol == "ns::Class::twice(std::string const&, int)"  # type: ignore[union-attr]
    assert [a.name for a in probe.args] == ["n"]  # type: ignore[union-attr]
    plus = parse_probe(f"{cpp}:ns::Class::operator+=(int)")
    assert (plus.symbol, plus.offset) == ("ns::Class::operator+=(int)", 0)  # type: ignore[union-attr]
    inside = parse_probe(f"{cpp}:ns::Class::method(int)+4")
    assert (inside.symbol, inside.offset) == ("ns::Class::method(int)", 4)  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="invalid offset 'zz'"):
        parse_probe(f"{cpp}:main+zz")


def test_resolved_probes_are_named_after_the_demangled_function(cpp: Path) -> None:
    probes = resolve_specs(
        [
            f"{cpp}:ns::Class::method(int) x=arg2:s32",
            f"r:{cpp}:ns::Class::method(double)",
            f"{cpp}:ns::add*",
        ]
    )
    table = SymbolTable.for_path(cpp)
    assert [p.spec.event_name for p in probes] == [  # type: ignore[union-attr]
        "ns_Class_method",
        "ns_Class_method__return",
        "ns_add_int",
        "ns_add_long",
    ]
    assert probes[0].offset == table.lookup("_ZN2ns5Class6methodEi").offset
    assert probes[0].symbol == "ns::Class::method(int)"
    assert probes[1].label == "ns::Class::method(double)"
    with pytest.raises(SpecError) as raised:
        resolve_specs([f"{cpp}:ns::Class::method x=arg2"])
    assert raised.value.column == len(str(cpp)) + 1


def test_symbols_command_lists_demangled_names(cpp: Path) -> None:
    def listing(*argv: str) -> str:
        args = build_parser().parse_args(["symbols", *argv])
        out, err = io.StringIO(), io.StringIO()
        assert symbols_run(args, out=out, err=err) == 0
        return out.getvalue()

    shown = listing(str(cpp), "ns::Class::*")
    assert "ns::Class::method(int)" in shown and "ns::Class::operator+=(int)" in shown
    assert "_ZN" not in shown
    raw = listing("--no-demangle", str(cpp), "ns::Class::*")
    assert "_ZN2ns5Class6methodEi" in raw and "ns::Class" not in raw
