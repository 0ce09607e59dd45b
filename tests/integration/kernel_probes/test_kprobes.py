"""kprobes and kretprobes through the tracefs engine, with kernel-identical text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from probescope.errors import ProbescopeError
from probescope.language.model import ProbeKind
from probescope.session import Session
from support.witness import record_both, same_but_time

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("kprobes")]

OPEN = "do_sys_openat2"


def test_kprobe_reads_user_string_argument(opened_file: Path) -> None:
    specs = [f"k:{OPEN} dfd=arg1:s32 name=+0(arg2):ustring", f"kr:{OPEN} fd=retval:s32"]
    session = Session(specs, engine="tracefs", command=["cat", str(opened_file)])
    with session:
        events = list(session.events(duration=60))
    opens = [e for e in events if e.kind is ProbeKind.KPROBE and e.arg("name") == str(opened_file)]
    assert len(opens) == 1
    assert opens[0].arg("dfd") == -100  # AT_FDCWD
    returns = [e for e in events if e.kind is ProbeKind.KRETPROBE]
    assert len(returns) == len([e for e in events if e.kind is ProbeKind.KPROBE])
    assert any(e.arg("fd") >= 3 for e in returns)
    summary = session.summary()
    assert summary.stats is not None
    assert summary.stats.hits["kprobes/p_do_sys_openat2_0"] >= 1
    assert "kprobes/p_do_sys_openat2_0" in summary.stats.misses


def test_kernel_grammar_kprobes_and_maxactive(opened_file: Path) -> None:
    specs = [f"p:kp/op {OPEN} $arg1 +0($arg2):ustring", f"r16:kp/opr {OPEN} $retval"]
    session = Session(specs, engine="tracefs", command=["cat", str(opened_file)])
    with session:
        events = list(session.events(duration=60))
    assert {e.name for e in events} == {"op", "opr"}


def test_unknown_kernel_symbol_is_refused_with_the_kernel_reason() -> None:
    session = Session(["k:probescope_no_such_function"], engine="tracefs", command=["true"])
    with pytest.raises(ProbescopeError, match=r"kernel refused|no such|not found|Failed"):
        session.start()
    session.close()


def test_kprobe_text_equals_kernel_trace(opened_file: Path) -> None:
    specs = [
        f"k:{OPEN} dfd=arg1:s32 name=+0(arg2):ustring how=arg3:x64",
        f"kr:{OPEN} fd=retval:s32",
    ]
    ours, expected = record_both(
        specs,
        ["sh", "-c", f"read line; exec cat {opened_file}"],
        lambda witness, engine: witness.enable_group(engine.group or ""),
        serial=98,
    )
    assert ours, "events arrived"
    assert same_but_time(ours) == same_but_time(expected)
    assert any("(do_sys_openat2+0x0/0x" in line for line in ours)
    returned = re.compile(r"\(\S+\+0x[0-9a-f]+/0x[0-9a-f]+ <- do_sys_openat2\)")
    assert any(returned.search(line) for line in ours)
