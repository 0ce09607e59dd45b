"""C++, Rust and Go test targets: programs whose functions carry mangled names (and Go's ABI).

Built with the machine's g++ (through support.build), rustc (legacy and v0 mangling) and go,
each cached by content under the test build cache. `rust()` and `go()` skip the calling test
with the reason when their compiler is missing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.build import CACHE, compile_program

CPP_SOURCE = r"""
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ns {
struct Class {
    int base;
    __attribute__((noinline)) int method(int x) { return base + x; }
    __attribute__((noinline)) int method(double x) { return base + (int)x; }
    __attribute__((noinline)) static int twice(const std::string &s, int n)
    {
        return (int)s.size() * n;
    }
    __attribute__((noinline)) Class &operator+=(int x) { base += x; return *this; }
};
template <typename T> __attribute__((noinline)) T add(T a, T b) { return a + b; }
}  // namespace ns

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    ns::Class c{argc};
    long total = 0;
    for (int i = 0; i < n; i++) {
        total += c.method(i) + c.method(2.5) + ns::Class::twice("hi", i);
        total += ns::add<int>(i, 1) + ns::add<long>(i, 2);
        c += 1;
    }
    printf("%ld\n", total);
    return 0;
}
"""

RUST_SOURCE = r"""
mod shapes {
    pub trait Area {
        fn area(&self) -> i64;
    }
    pub struct Square(pub i64);
    impl Area for Square {
        #[inline(never)]
        fn area(&self) -> i64 {
            std::hint::black_box(self.0 * self.0)
        }
    }
    #[inline(never)]
    pub fn total<T: Area>(items: &[T]) -> i64 {
        items.iter().map(|s| s.area()).sum()
    }
}

#[inline(never)]
fn add(a: i64, b: i64) -> i64 {
    std::hint::black_box(a + b)
}

fn main() {
    let n: i64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut sum = 0;
    for i in 0..n {
        let v = vec![shapes::Square(i), shapes::Square(2)];
        sum += shapes::total(&v) + add(i, 1);
    }
    println!("{}", sum);
}
"""

GO_SOURCE = r"""
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

//go:noinline
func Add(a, b int) int { return a*3 + b }

//go:noinline
func Greet(name string, times int) int { return len(name) * times }

//go:noinline
func Say(s string, n int) int { return len(s) + n }

// sayStrings passes Say the strings of tests/integration/cross_engine/test_go_strings.py.
func sayStrings() int {
	long := strings.Repeat("probescope-", 10)
	sentence := "the gopher said hello to the world"
	total := Say("hello", 1) + Say("", 2) + Say(long, 3) + Say(sentence[4:10], 4)
	total += Say("h\u00e9llo, \u4e16\u754c", 5) + Say(strings.Repeat("x", 5000), 6)
	return total
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "strings" {
		fmt.Println(sayStrings())
		return
	}
	n := 1
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	total := 0
	for i := 0; i < n; i++ {
		total += Add(i, 7) + Greet("gopher", i)
	}
	fmt.Println(total)
}
"""


def cpp(flags: Sequence[str] = ("-O1", "-g")) -> Path:
    return compile_program(CPP_SOURCE, "cpp_names", flags, language="c++")


def rust(mangling: str = "legacy") -> Path:
    """The Rust program with its own functions mangled `legacy` (`_ZN…17h<hash>E`, rustc's
    default, which stable rustc no longer lets one ask for by name) or `v0` (`_R…`)."""
    rustc = shutil.which("rustc") or _cargo_tool("rustc")
    if rustc is None:
        pytest.skip("rustc is not installed")
    flags = ["-O", "-g"]
    if mangling != "legacy":
        flags += ["-C", f"symbol-mangling-version={mangling}"]
    binary = _built(RUST_SOURCE, f"rust_{mangling}", "rs", [rustc, *flags, "-o", "{out}", "{src}"])
    if mangling == "legacy" and not re.search(rb"_ZN\d+\w+6shapes", binary.read_bytes()):
        pytest.skip("this rustc no longer mangles with the legacy scheme by default")
    return binary


def go() -> Path:
    """The Go program (register ABI: Go 1.17 and later on amd64)."""
    compiler = shutil.which("go") or (
        "/usr/lib/go/bin/go" if os.path.exists("/usr/lib/go/bin/go") else None
    )
    if compiler is None:
        pytest.skip("no Go toolchain (Debian package golang-go)")
    return _built(GO_SOURCE, "go_names", "go", [compiler, "build", "-o", "{out}", "{src}"], go=True)


def _cargo_tool(name: str) -> str | None:
    path = Path.home() / ".cargo" / "bin" / name
    return str(path) if path.exists() else None


def _built(source: str, name: str, suffix: str, command: list[str], *, go: bool = False) -> Path:
    key = hashlib.sha256("\0".join([source, name, *command]).encode()).hexdigest()[:16]
    out_dir = CACHE / f"{name}-{key}"
    out = out_dir / name
    if out.exists():
        return out
    tmp_dir = out_dir.with_suffix(".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    src = tmp_dir / f"{name}.{suffix}"
    src.write_text(source)
    tmp_out = tmp_dir / name
    env = dict(os.environ)
    if go:
        env.update(
            GOCACHE=str(tmp_dir / "gocache"), GOPATH=str(tmp_dir / "gopath"), GOFLAGS="-mod=mod"
        )
        env.setdefault("HOME", str(tmp_dir))
    argv = [part.replace("{out}", str(tmp_out)).replace("{src}", str(src)) for part in command]
    subprocess.run(argv, check=True, cwd=tmp_dir, env=env, capture_output=True)
    for leftover in ("gocache", "gopath"):
        shutil.rmtree(tmp_dir / leftover, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.rename(out_dir)
    return out
