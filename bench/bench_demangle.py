"""Benchmark: which demangler probescope uses, measured against `c++filt` on real symbols.

Run: `.venv/bin/python bench/bench_demangle.py [--runs N] [--install]`. The corpus is every
defined dynamic symbol of libstdc++ (about 5,900 Itanium names) and the symbols of a Rust
program compiled here twice by rustc (legacy `_ZN...17h<hash>E` names and `_R...` v0 names;
skipped with a reason when rustc is missing). The reference is GNU `c++filt` (binutils)
on the same names, in one process.

binutils has two spellings: `c++filt -i` (what `nm -C`, `objdump -C`, gdb and perf print:
`std::istream::gcount()`, Rust names without their hash or crate disambiguators) and plain
`c++filt` (verbose: `std::basic_istream<char, std::char_traits<char> >::gcount()`, hashes kept).

For each candidate installed (PyPI: pycxxfilt, cxxfilt, itanium-demangler, rust-demangler,
pydemumble, cpp-demangle, pyderust, demangle, multi-demangle; `--install` puts them into a
throw-away venv first) it prints, per corpus, how many names it spells exactly as
`c++filt -i`, and how many are *equivalent* — equal to either binutils spelling once spaces
that separate no two words are dropped (`> >` and `>>`); then the median time to demangle the
libstdc++ corpus in-process and its ratio to one `c++filt -i` run over the same names (a
subprocess, start-up included). A library that cannot read a kind of name (a C++-only one on
`_R` names) scores 0 there.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LIBSTDCXX = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
CANDIDATES = (
    "demangle",
    "multi-demangle",
    "pycxxfilt",
    "cxxfilt",
    "itanium-demangler",
    "rust-demangler",
    "pydemumble",
    "cpp-demangle",
    "pyderust",
)
RUST_PROGRAM = """
mod shapes {
    pub trait Area { fn area(&self) -> f64; }
    pub struct Square(pub f64);
    impl Area for Square { #[inline(never)] fn area(&self) -> f64 { self.0 * self.0 } }
    #[inline(never)]
    pub fn total<T: Area>(items: &[T]) -> f64 { items.iter().map(|s| s.area()).sum() }
}
#[inline(never)]
fn add(a: i64, b: i64) -> i64 { a + b }
fn main() {
    let v = vec![shapes::Square(2.0), shapes::Square(3.0)];
    println!("{} {}", shapes::total(&v), add(1, 2));
}
"""

Demangle = Callable[[str], str | None]


def defined_symbols(path: str) -> list[str]:
    """Names of the defined symbols of `path` (dynamic ones for a shared library)."""
    dynamic = ["-D"] if ".so" in os.path.basename(path) else []
    out = subprocess.run(
        ["nm", *dynamic, "--defined-only", path], capture_output=True, text=True, check=True
    ).stdout
    names = []
    for line in out.splitlines():
        words = line.split()
        if words and (words[-1].startswith("_Z") or words[-1].startswith("_R")):
            names.append(words[-1].split("@", 1)[0])
    return sorted(set(names))


def rust_corpora(work: Path) -> dict[str, list[str]]:
    rustc = shutil.which("rustc")
    if rustc is None:
        print("rust corpora skipped: no rustc on PATH")
        return {}
    source = work / "shapes.rs"
    source.write_text(RUST_PROGRAM)
    corpora = {}
    for label, flags in (("legacy", []), ("v0", ["-C", "symbol-mangling-version=v0"])):
        binary = work / f"shapes_{label}"
        subprocess.run([rustc, "-O", *flags, "-o", str(binary), str(source)], check=True)
        names = defined_symbols(str(binary))
        prefix = "_ZN" if label == "legacy" else "_R"
        corpora[f"rust {label}"] = [n for n in names if n.startswith(prefix)]
    return corpora


def cxxfilt(names: list[str], *flags: str) -> tuple[list[str], float]:
    """c++filt's spelling of every name (one process), and how long that process took."""
    started = time.perf_counter()
    out = subprocess.run(
        ["c++filt", *flags],
        input="\n".join(names) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines(), time.perf_counter() - started


_WORD = re.compile(r"\w")


def squeezed(text: str | None) -> str | None:
    """`text` without the spaces that separate no two words (`> >` → `>>`, `, ` → `,`)."""
    if text is None:
        return None
    kept = []
    for index, char in enumerate(text):
        if char == " " and not (
            0 < index < len(text) - 1
            and _WORD.match(text[index - 1])
            and _WORD.match(text[index + 1])
        ):
            continue
        kept.append(char)
    return "".join(kept)


def adapters() -> dict[str, Demangle]:
    """One `demangle(name) -> text or None` per importable candidate, on its documented API."""
    found: dict[str, Demangle] = {}

    def attempt(label: str, module: str, make: Callable[[object], Demangle]) -> None:
        try:
            found[label] = make(importlib.import_module(module))
        except Exception as error:  # a candidate that fails to load is reported, not fatal
            print(f"{label}: not measured ({type(error).__name__}: {error})")

    def guarded(function: Callable[[str], object]) -> Demangle:
        def call(name: str) -> str | None:
            try:
                result = function(name)
            except Exception:
                return None
            return None if result is None else str(result)

        return call

    attempt("pycxxfilt (LLVM)", "pycxxfilt", lambda m: guarded(m.demangle))  # type: ignore[attr-defined]
    attempt("cxxfilt (__cxa_demangle)", "cxxfilt", lambda m: guarded(m.demangle))  # type: ignore[attr-defined]
    attempt(
        "itanium-demangler",
        "itanium_demangler",
        lambda m: guarded(lambda n: m.parse(n)),  # type: ignore[attr-defined]
    )
    attempt("rust-demangler", "rust_demangler", lambda m: guarded(m.demangle))  # type: ignore[attr-defined]
    attempt("pydemumble (LLVM)", "pydemumble", lambda m: guarded(m.demangle))  # type: ignore[attr-defined]
    attempt("cpp-demangle (Rust crate)", "cpp_demangle", lambda m: guarded(m.demangle))  # type: ignore[attr-defined]
    attempt("pyderust (rustc-demangle)", "pyderust", lambda m: guarded(m.demangle))  # type: ignore[attr-defined]
    attempt("demangle (pure Python)", "demangle", lambda m: guarded(m.demangle_strict))  # type: ignore[attr-defined]
    attempt(
        "multi-demangle",
        "multi_demangle",
        lambda m: guarded(m.demangle_symbol),  # type: ignore[attr-defined]
    )
    return found


def timed(demangle: Demangle, names: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        for name in names:
            demangle(name)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--install", action="store_true", help="install the candidates into a throw-away venv"
    )
    args = parser.parse_args()
    if shutil.which("c++filt") is None:
        print("c++filt (binutils) is needed as the reference")
        return 1
    if args.install and not os.environ.get("BENCH_DEMANGLE_CHILD"):
        with tempfile.TemporaryDirectory() as venv:
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            python = os.path.join(venv, "bin", "python")
            subprocess.run([python, "-m", "pip", "install", "-q", *CANDIDATES], check=False)
            env = dict(os.environ, BENCH_DEMANGLE_CHILD="1")
            return subprocess.run([python, __file__, "--runs", str(args.runs)], env=env).returncode
    with tempfile.TemporaryDirectory() as work:
        corpora = {"libstdc++": defined_symbols(LIBSTDCXX), **rust_corpora(Path(work))}
    short = {label: cxxfilt(names, "-i")[0] for label, names in corpora.items()}
    verbose = {label: cxxfilt(names)[0] for label, names in corpora.items()}
    reference_time = statistics.median(
        cxxfilt(corpora["libstdc++"], "-i")[1] for _ in range(args.runs)
    )
    version = subprocess.run(["c++filt", "--version"], capture_output=True, text=True)
    print(f"reference: {version.stdout.splitlines()[0]}")
    print("corpus: " + ", ".join(f"{label} {len(names)} names" for label, names in corpora.items()))
    print("per corpus: names spelled exactly as `c++filt -i` / names equivalent to c++filt")
    print(f"{'candidate':27}" + "".join(f"{label:>20}" for label in corpora) + "   libstdc++ time")
    for label, demangle in adapters().items():
        row = f"{label:27}"
        for corpus, names in corpora.items():
            exact = equivalent = 0
            for name, spelled, verbosely in zip(names, short[corpus], verbose[corpus], strict=True):
                got = demangle(name)
                exact += got == spelled
                equivalent += got is not None and squeezed(got) in (
                    squeezed(spelled),
                    squeezed(verbosely),
                )
            row += f"{exact:>6} / {equivalent:<6}".rjust(20)
        elapsed = timed(demangle, corpora["libstdc++"], args.runs)
        row += f"   {elapsed * 1e3:7.1f} ms  {elapsed / reference_time:5.2f}x c++filt"
        print(row)
    print(f"{'c++filt -i (a subprocess)':27}" + " " * 20 * len(corpora), end="")
    print(f"   {reference_time * 1e3:7.1f} ms  {1.0:5.2f}x c++filt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
