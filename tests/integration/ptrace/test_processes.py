"""Threads, fork, vfork, exec and dlopen: probes follow the program wherever it goes, and
children we do not follow get their original bytes back."""

from __future__ import annotations

import collections

from integration.ptrace.harness import (
    assert_same_behaviour,
    make_probe,
    run_plain,
    run_traced,
)


def test_threads(target):
    path = target("threads.c", ("-O0", "-g", "-pthread"))
    probe = make_probe(path, "work", "id=%di:s64 i=%si:s64")
    run = run_traced([probe], [path])
    assert_same_behaviour(run, run_plain([path]))
    events = run.named("work")
    assert len(events) == 4 * 25
    by_tid = collections.defaultdict(list)
    for event in events:
        by_tid[event.tid].append(event)
    assert len(by_tid) == 4
    pid = run.engine.pids[0]
    for tid, mine in by_tid.items():
        assert tid != pid
        assert {e.pid for e in mine} == {pid}
        assert len({e.arg("id") for e in mine}) == 1
        assert [e.arg("i") for e in mine] == list(range(25))


def test_fork_children_are_followed(target):
    path = target("forks.c")
    probe = make_probe(path, "work", "who=%di:s32 i=%si:s32")
    run = run_traced([probe], [path])
    assert_same_behaviour(run, run_plain([path]))
    pid = run.engine.pids[0]
    parent = [(e.arg("who"), e.arg("i")) for e in run.events if e.pid == pid]
    children = [(e.arg("who"), e.arg("i"), e.pid) for e in run.events if e.pid != pid]
    assert parent == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert [(w, i) for w, i, _ in children] == [(2, 0), (2, 1), (2, 2)]
    assert len({p for _, _, p in children}) == 1


def test_fork_children_not_followed_get_their_bytes_back(target):
    path = target("forks.c")
    probe = make_probe(path, "work", "who=%di:s32")
    run = run_traced([probe], [path], follow_children=False)
    # The child inherits the int3 bytes: were they not restored it would die of SIGTRAP.
    assert_same_behaviour(run, run_plain([path]))
    assert [e.arg("who") for e in run.events] == [1, 1, 3, 3]


def test_exec_reinserts_probes_in_the_new_image(target):
    path = target("execs.c")
    probe = make_probe(path, "work", "generation=%di:s32")
    run = run_traced([probe], [path])
    assert_same_behaviour(run, run_plain([path]))
    assert run.exit_code == 5
    assert [e.arg("generation") for e in run.events] == [1, 2]
    assert len({e.pid for e in run.events}) == 1
    assert len({e.ip for e in run.events}) == 2  # ASLR: a new load address after exec


def test_dlopen_libraries_get_probes_when_mapped(target, build):
    from integration.ptrace.harness import TARGETS

    library = build(
        (TARGETS / "plugin.c").read_text(), "plugin.so", ("-O0", "-g", "-shared", "-fPIC")
    )
    path = target("dlopen.c", ("-O0", "-g", "-ldl"))
    entry = make_probe(library, "plugin_fn", "x=%di:s32")
    ret = make_probe(library, "plugin_fn", "r=$retval:s32", kind="r", event="plugin_ret")
    run = run_traced([entry, ret], [path, str(library)])
    assert_same_behaviour(run, run_plain([path, str(library)]))
    assert [e.arg("x") for e in run.named("plugin_fn")] == [0, 1, 2, 1, 2, 3]
    assert [e.arg("r") for e in run.named("plugin_ret")] == [1, 2, 5, 2, 5, 10]


def test_probe_in_libc_applies_in_every_process_mapping_it(target):
    from integration.ptrace.harness import LIBC

    path = target("forks.c")
    probe = make_probe(LIBC, "getpid", event="libc_getpid")
    write = make_probe(LIBC, "write", "fd=%di:s32 n=%dx:u64", event="libc_write")
    run = run_traced([probe, write], [path])
    assert_same_behaviour(run, run_plain([path]))
    writers = collections.Counter(e.pid for e in run.named("libc_write"))
    # parent, forked child and the vfork child's /bin/echo all write to stdout.
    assert len(writers) == 3
    assert sum(e.arg("n") for e in run.named("libc_write")) == len(run.stdout)
