"""The ptrace engine records what the kernel records: the same definitions are written into
tracefs by hand (a private instance), the program runs once under each, with address space
randomization off so addresses match too, and every argument is compared in the kernel's own
text format (the instance's `trace` file)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.ptrace.harness import LIBC, elf_symbol, run_traced
from probescope.engines.ptrace import PtraceEngine
from probescope.events import Event
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ArgType, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from support.tracefs import append as tracefs_append
from support.tracefs import tracefs_root

pytestmark = pytest.mark.root

GROUP = f"probescope_ptrace_{os.getpid()}"
NO_ASLR = ("setarch", "x86_64", "-R")
_LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<tid>\d+)\s+\[\d+\] (?P<flags>\S+)\s+[\d.]+: "
    r"(?P<event>\w+): \((?P<where>[^)]*)\)(?P<args>.*)$"
)


@pytest.fixture
def kernel() -> Iterator[tuple[Path, Path]]:
    root = tracefs_root()
    assert root is not None
    instance = root / "instances" / f"probescope-ptrace-{os.getpid()}"
    instance.mkdir()
    try:
        yield root, instance
    finally:
        group = instance / "events" / GROUP
        if group.exists():
            (group / "enable").write_text("0")
        instance.rmdir()
        for line in (root / "dynamic_events").read_text().splitlines():
            if f":{GROUP}/" in line:
                tracefs_append(root / "dynamic_events", f"-:{line.split()[0].split(':', 1)[1]}\n")
        assert not [
            line for line in (root / "dynamic_events").read_text().splitlines() if GROUP in line
        ]


def _kernel_text(value: object, arg_type: ArgType) -> str:
    if arg_type.count:
        assert isinstance(value, tuple)
        return "{" + ",".join(_scalar(v, arg_type) for v in value) + "}"
    return _scalar(value, arg_type)


def _scalar(value: object, arg_type: ArgType) -> str:
    if arg_type.is_string:
        return "(fault)" if value is None else f'"{value}"'
    if arg_type.base == "char":
        assert isinstance(value, str)
        return f"'{value}'"
    assert isinstance(value, int)
    if arg_type.is_hex:
        return f"0x{value:x}"
    return str(value)


def _ptrace_line(event: Event) -> tuple[str, str, str]:
    where = (
        f"0x{event.ret_ip:x} <- 0x{event.ip:x}" if event.ret_ip is not None else f"0x{event.ip:x}"
    )
    args = "".join(
        f" {name}={_kernel_text(value, arg_type)}"
        for name, value, arg_type in zip(
            event.type.arg_names, event.args, event.type.arg_types, strict=True
        )
    )
    return event.name, where, args


def _kernel_lines(instance: Path, tids: set[int]) -> list[tuple[str, str, str]]:
    out = []
    for line in (instance / "trace").read_text().splitlines():
        if line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match, line
        if int(match["tid"]) in tids:
            out.append((match["event"], match["where"], match["args"]))
    return out


def _compare(kernel: tuple[Path, Path], definitions: list[str], argv: list[str]) -> int:
    root, instance = kernel
    probes = []
    for text in definitions:
        spec = parse_kernel_probe(text)
        assert isinstance(spec, ProbeSpec)
        probes.append(ResolvedProbe.from_uprobe_spec(spec))
        tracefs_append(root / "dynamic_events", text + "\n")
    (instance / "events" / GROUP / "enable").write_text("1")
    try:
        plain = subprocess.Popen([*NO_ASLR, *argv], stdout=subprocess.PIPE)
        stdout, _ = plain.communicate(timeout=60)
    finally:
        (instance / "events" / GROUP / "enable").write_text("0")
    # Only what the program itself did, not setarch before its exec (same pid, with ASLR;
    # `trace` prints the comm a pid has when it is read, so filter by non-random address).
    comm = Path(argv[0]).name[:15]
    run = run_traced(probes, [*NO_ASLR, *argv], engine=PtraceEngine())
    assert (run.stdout, run.exit_code) == (stdout, plain.returncode)
    ptrace_lines = [_ptrace_line(e) for e in run.events if e.comm == comm]
    addresses = {line[1].split()[-1] for line in ptrace_lines}
    kernel_lines = [
        line for line in _kernel_lines(instance, {plain.pid}) if line[1].split()[-1] in addresses
    ]
    assert len(ptrace_lines) == len(kernel_lines)
    for index, (mine, theirs) in enumerate(zip(ptrace_lines, kernel_lines, strict=True)):
        assert mine[:2] == theirs[:2], f"event {index}"
        ours, kernels = mine[2].split(), theirs[2].split()
        differences = [(a, b) for a, b in zip(ours, kernels, strict=True) if a != b]
        assert not differences, f"event {index} {mine[0]}: ptrace vs kernel {differences}"
    return len(kernel_lines)


def test_fetchargs_match_the_kernel(kernel, target):
    path = target("loop.c")
    work = elf_symbol(path, "work").offset
    counter = elf_symbol(path, "counter").vaddr
    definitions = [
        f"p:{GROUP}/work {path}:0x{work:x} i=%di:s32 name=+0(%si):string c=+0(%si):char "
        "bits=+0(%dx):b5@3/32 low=+0(%dx):b3@0/8 word=+0(%dx):x32 arr=+0(%si):u8[3] "
        "ip=%ip sp=%sp fl=%flags cs=%cs ss=%ss oa=%orig_ax st=$stack st0=$stack0 st1=$stack1 "
        f'comm=$comm imm=\\42 ims=\\"text":string ctr=@+0x{counter:x}:s64 '
        "nul=+0(%ax):u64 nuls=+0(%ax):string deep=+8(+0($stack)):x64 sarr=+0(%si):string[1] "
        "neg=-20(%bp):s16 u=+0(%si):u16 x8=%di:x8 s8=+1(%si):s8 dflt=%si",
        f"r:{GROUP}/work_ret {path}:0x{work:x} ret=$retval:s32 rx=$retval:x16 ip=%ip sp=%sp "
        "fl=%flags st0=$stack0 comm=$comm",
    ]
    assert _compare(kernel, definitions, [str(path), "4"]) == 8


def test_recursion_and_instruction_sites_match_the_kernel(kernel, target):
    fib = target("recursion.c")
    offset = elf_symbol(fib, "fib").offset
    definitions = [
        f"p:{GROUP}/fib {fib}:0x{offset:x} n=%di:s64 ret_addr=$stack0",
        f"r:{GROUP}/fib_ret {fib}:0x{offset:x} r=$retval:s64",
    ]
    assert _compare(kernel, definitions, [str(fib), "4"]) == 18
    (kernel[1] / "trace").write_text("")
    for line in (kernel[0] / "dynamic_events").read_text().splitlines():
        if f":{GROUP}/" in line:
            tracefs_append(kernel[0] / "dynamic_events", f"-:{line.split()[0].split(':', 1)[1]}\n")
    sites = target("sites.c")
    labels = [
        "site_riprel_load",
        "site_call",
        "site_jcc",
        "site_loop",
        "site_push",
        "site_icall_mem",
        "site_lea",
    ]
    definitions = [
        f"p:{GROUP}/{label} {sites}:0x{elf_symbol(sites, label).offset:x} "
        "ip=%ip sp=%sp ax=%ax cx=%cx fl=%flags"
        for label in labels
    ]
    assert _compare(kernel, definitions, [str(sites)]) > 12 * len(labels)


def test_libc_probe_matches_the_kernel(kernel, target):
    path = target("malloc.c")
    malloc = elf_symbol(LIBC, "malloc").offset
    definitions = [
        f"p:{GROUP}/malloc {LIBC}:0x{malloc:x} size=%di:u64 caller=+0($stack):x64",
        f"r:{GROUP}/malloc_ret {LIBC}:0x{malloc:x} null=$retval:u8",
    ]
    assert _compare(kernel, definitions, [str(path)]) == 10
