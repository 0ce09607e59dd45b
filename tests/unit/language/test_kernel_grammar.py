"""Kernel-grammar cases beyond uprobes that this machine's kernel cannot check (kprobes,
eprobes, deletes) plus rendering details; the uprobe grammar is diffed against the live
kernel in tests/integration/language."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError, SpecErrors
from probescope.language.arch import X86_64
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import (
    DeleteSpec,
    Dereference,
    FileOffset,
    KernelSymbol,
    ProbeKind,
    ProbeSpec,
    Register,
)


def kprobe(text: str) -> ProbeSpec:
    spec = parse_kernel_probe(text, events_file=EventsFile.KPROBE_EVENTS, arch=X86_64)
    assert isinstance(spec, ProbeSpec)
    return spec


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("p do_sys_open", "p:kprobes/p_do_sys_open_0 do_sys_open"),
        ("p:myprobe do_sys_open+8", "p:kprobes/myprobe do_sys_open+8"),
        ("r do_sys_open", "r:kprobes/r_do_sys_open_0 do_sys_open"),
        ("r10:grp/ev vfs_read $retval", "r10:grp/ev vfs_read arg1=$retval"),
        ("p:ev ext4:ext4_sync_fs", "p:kprobes/ev ext4:ext4_sync_fs"),
        ("p ext4:ext4_sync_fs", "p:kprobes/p_ext4_ext4_sync_fs_0 ext4:ext4_sync_fs"),
        ("p:ev vfs_read%return", "r:kprobes/ev vfs_read"),
        (
            "p:ev do_sys_open dfd=$arg1 name=+0($arg2):string",
            "p:kprobes/ev do_sys_open dfd=$arg1 name=+0($arg2):string",
        ),
        (
            "p:ev do_sys_open @jiffies @jiffies+8:u64 +u0($arg2):ustring",
            "p:kprobes/ev do_sys_open arg1=@jiffies arg2=@jiffies+8:u64 arg3=+u0($arg2):ustring",
        ),
        (
            "p:ev do_sys_open %di:symbol $arg1:symstr",
            "p:kprobes/ev do_sys_open arg1=%di:symbol arg2=$arg1:symstr",
        ),
        ("r:ev vfs_read $arg1", "r:kprobes/ev vfs_read arg1=$arg1"),
        ("p:ev 0xffffffff81000000", "p:kprobes/ev 0xffffffff81000000"),
    ],
)
def test_kprobe_rendering(text: str, line: str) -> None:
    assert str(kprobe(text)) == line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p5:ev do_sys_open", "maxactive is only for function exit"),
        ("r0:ev do_sys_open", "invalid maxactive"),
        ("r4097:ev do_sys_open", "too big"),
        ("r:ev do_sys_open+8", "function entry"),
        ("p:ev do_sys_open+-8", "invalid probed address"),
        ("p:ev do_sys_open%ret", "suffix"),
        ("p:ev do_sys_open+8 $arg1", "function entry or exit"),
        ("p:ev do_sys_open @+0x10", "file offsets are not available with kprobes"),
        ("p:ev do_sys_open $retval", "not available on an entry probe"),
        ("p:ev 0x1000 $arg1", "function entry or exit"),
        ("p:ev do_sys_open $stack9999", "invalid stack number"),
        ("p:ev do_sys_open name", "BTF"),
    ],
)
def test_kprobe_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        kprobe(text)


def test_kprobe_fetch_ast() -> None:
    spec = kprobe("p:ev do_sys_open +u8(+0(%di)) @jiffies-4")
    deref = spec.args[0].fetch
    assert isinstance(deref, Dereference) and deref.user and deref.offset == 8
    assert deref.base == Dereference(0, Register("di"))
    assert spec.args[1].fetch == KernelSymbol("jiffies", -4)
    assert spec.kind is ProbeKind.KPROBE


def test_uprobe_file_offset_fetch() -> None:
    spec = parse_kernel_probe("p /bin/true:0x10 @+-16", arch=X86_64)
    assert isinstance(spec, ProbeSpec)
    assert spec.args[0].fetch == FileOffset(-16)


def test_uprobe_lines_are_not_kprobe_lines() -> None:
    with pytest.raises(SpecError, match="not a uprobe location"):
        parse_kernel_probe("p:ev do_sys_open", events_file=EventsFile.UPROBE_EVENTS)
    with pytest.raises(SpecError, match="not a kprobe location"):
        parse_kernel_probe("p:ev /bin/true:0x10", events_file=EventsFile.KPROBE_EVENTS)
    with pytest.raises(SpecError, match="there are no kprobe events"):
        parse_kernel_probe("p:ev do_sys_open", kprobes=False)


def test_dynamic_events_takes_both() -> None:
    assert parse_kernel_probe("p:ev do_sys_open").kind is ProbeKind.KPROBE  # type: ignore[union-attr]
    assert parse_kernel_probe("p:ev /bin/true:0x10").kind is ProbeKind.UPROBE  # type: ignore[union-attr]


def test_eprobes() -> None:
    spec = parse_kernel_probe("e:grp/ev sched.sched_switch prev=$prev_pid:u32 if prev_pid > 0")
    assert isinstance(spec, ProbeSpec)
    assert spec.kind is ProbeKind.EPROBE
    assert str(spec) == "e:grp/ev sched.sched_switch prev=$prev_pid:u32 if prev_pid > 0"
    with pytest.raises(SpecError, match="registers are not available"):
        parse_kernel_probe("e:ev sched.sched_switch %di")
    with pytest.raises(SpecError, match=r"SYSTEM\.EVENT"):
        parse_kernel_probe("e:ev sched_switch")


@pytest.mark.parametrize(
    ("text", "group", "event", "words"),
    [
        ("-:uprobes/ev", "uprobes", "ev", ()),
        ("-:ev", None, "ev", ()),
        ("-:grp/", "grp", None, ()),
        ("-:grp/ev /bin/true:0x10 %di", "grp", "ev", ("/bin/true:0x10", "%di")),
    ],
)
def test_deletes(text: str, group: str | None, event: str | None, words: tuple[str, ...]) -> None:
    spec = parse_kernel_probe(text)
    assert spec == DeleteSpec(group, event, words)


def test_bad_deletes() -> None:
    with pytest.raises(SpecError):
        parse_kernel_probe("-x")
    with pytest.raises(SpecError):
        parse_kernel_probe("-:")


def test_all_bad_arguments_are_reported_together() -> None:
    text = "p:ev /bin/true:0x10 %rax +0(%di):strng $stack0x1"
    with pytest.raises(SpecErrors) as info:
        parse_kernel_probe(text, arch=X86_64)
    columns = [e.column for e in info.value.errors]
    assert [text[c:].split()[0] for c in columns if c is not None][:2] == ["%rax", "strng"]
    assert len(info.value.errors) == 3
    assert info.value.render().count("^") == 3


def test_octal_offset_hint() -> None:
    with pytest.raises(SpecError, match="invalid uprobe offset") as info:
        parse_kernel_probe("p /bin/true:089")
    assert info.value.hint is not None and "octal" in info.value.hint


@pytest.mark.parametrize(
    "deref", ["+u8(%rax)", "-u8(%rax)", "+8(%rax)", "-8(%rax)", "+u0(+0(%rax))"]
)
def test_errors_inside_a_dereference_point_at_the_inner_fetch(deref: str) -> None:
    text = f"p:ev /bin/true:0x10 x={deref}"
    with pytest.raises(SpecError, match="invalid register") as info:
        parse_kernel_probe(text, arch=X86_64)
    assert info.value.column is not None
    assert text[info.value.column :].startswith("%rax)")


@pytest.mark.parametrize("arg", ["+u0(%di):u8[2]", "+u0(+0(%di)):u32[2]"])
def test_arrays_are_not_read_through_a_user_space_dereference(arg: str) -> None:
    """The kernel's store op is then ST_UMEM, which its array check refuses (BAD_STRING)."""
    with pytest.raises(SpecError, match="user-space dereference"):
        parse_kernel_probe(f"p:ev /bin/true:0x10 {arg}", arch=X86_64)
    for accepted in ("+0(+u0(%di)):u32[2]", "+u0(%di):string[2]", "+u0(%di):b3@2/8"):
        parse_kernel_probe(f"p:ev /bin/true:0x10 {accepted}", arch=X86_64)
