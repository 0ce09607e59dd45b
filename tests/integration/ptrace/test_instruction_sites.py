"""Probes on every class of displaced instruction, run three ways: emulated where possible
(the default), always from the relocated slot, and single-stepped like the kernel does."""

from __future__ import annotations

import pytest

from integration.ptrace.harness import assert_same_behaviour, make_probe, run_plain, run_traced
from probescope.engines.ptrace import PtraceEngine

# site label -> (enclosing function, hits in one run of sites.c: 12 iterations)
SITES = {
    "site_riprel_load": ("riprel_load", 12),
    "site_riprel_store": ("riprel_store", 12),
    "site_call": ("call_rel", 12),
    "site_jcc": ("jcc_fn", 12),
    "site_jcc_near": ("jcc_near_fn", 12),
    "site_loop": ("loop_fn", sum(i + 1 for i in range(12))),
    "site_jrcxz": ("jrcxz_fn", 12),
    "site_jmp": ("jmp_fn", 12),
    "site_ret": ("ret_fn", 12),
    "site_push": ("push_fn", 12),
    "site_nop": ("nop_fn", 12),
    "site_endbr": ("endbr_fn", 12),
    "site_icall_reg": ("icall_reg", 12),
    "site_icall_mem": ("icall_mem", 12),
    "site_lea": ("lea_fn", 12),
}

MODES = {
    "emulate": {},
    "slot": {"emulate": False},
    "single-step": {"single_step": True},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_every_instruction_class(target, mode):
    path = target("sites.c")
    probes = [
        make_probe(path, site, "ip=%ip sp=%sp di=%di", function=function)
        for site, (function, _) in SITES.items()
    ]
    engine = PtraceEngine(**MODES[mode])
    run = run_traced(probes, [path], engine=engine)
    assert_same_behaviour(run, run_plain([path]))
    counts = {site: len(run.named(site)) for site in SITES}
    assert counts == {site: hits for site, (_, hits) in SITES.items()}
    for event in run.events:
        assert event.arg("ip") == event.ip
    extra = run.stats.extra
    if mode == "single-step":
        assert extra["single_steps"] > 0
    else:
        assert extra["single_steps"] == 0
    if mode == "slot":
        assert extra["emulated"] == 0


def test_emulation_covers_branches_and_nops(target):
    path = target("sites.c")
    emulated = [
        "site_call",
        "site_jcc",
        "site_jcc_near",
        "site_loop",
        "site_jrcxz",
        "site_jmp",
        "site_nop",
        "site_endbr",
        "site_icall_reg",
        "site_icall_mem",
    ]
    probes = [make_probe(path, site, function=SITES[site][0]) for site in emulated]
    run = run_traced(probes, [path])
    assert_same_behaviour(run, run_plain([path]))
    extra = run.stats.extra
    assert extra["emulated"] == extra["hits"] == sum(SITES[s][1] for s in emulated)
    assert extra["slot_runs"] == extra["internal_hits"]  # the dynamic linker's r_brk `ret`
    # One ptrace stop per hit (plus the dynamic linker's and the exit's stops).
    assert extra["stops"] <= extra["hits"] + extra["internal_hits"] + 2


def test_probe_inside_an_instruction_is_refused(target):
    path = target("sites.c")
    good = make_probe(path, "site_riprel_load", function="riprel_load")
    from dataclasses import replace

    from probescope.errors import PtraceError

    inside = replace(
        good, offset=good.offset + 2, spec=good.spec, symbol_offset=good.symbol_offset + 2
    )
    with pytest.raises(PtraceError, match=r"inside the instruction at 0x[0-9a-f]+ \(mov rax"):
        run_traced([inside], [path])


GO_LOOKALIKE = r"""
__attribute__((used, section(".go.buildinfo"))) static const char buildinfo[32] =
    "\xff Go buildinf:";
__attribute__((noinline)) int work(int x) { return x + 1; }
int main(int argc, char **argv) { (void)argv; return work(argc) - 2; }
"""


def test_return_probes_on_go_binaries_are_refused(build):
    """Whether Go linked the file travels on the ResolvedProbe from resolving; a probe built
    from kernel grammar alone gets it from symbols/ at attach time."""
    from probescope.errors import PtraceError
    from probescope.symbols.resolve import resolve_specs

    path = build(GO_LOOKALIKE, "go_lookalike")
    (resolved,) = resolve_specs([f"r:{path}:work"])
    assert resolved.go_binary is True and resolved.boundary_checked
    with pytest.raises(PtraceError, match="return probes on Go binaries are refused"):
        run_traced([resolved], [str(path)])
    by_hand = make_probe(path, "work", kind="r")
    assert by_hand.go_binary is None
    with pytest.raises(PtraceError, match="return probes on Go binaries are refused"):
        run_traced([by_hand], [str(path)])
    entry = make_probe(path, "work")  # entry probes are fine
    run = run_traced([entry], [str(path)])
    assert len(run.named("work")) == 1
