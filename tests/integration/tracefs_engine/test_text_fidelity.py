"""Our text lines are the kernel's lines: the same events recorded in a witness instance are
printed by the kernel's own `trace` file and compared byte for byte with the text sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from probescope.system.kernel import RunningKernel
from support.witness import record_both, same_but_time

pytestmark = pytest.mark.root

SPECS = [
    "{t}:func_1 a=arg1:s32 hex=arg1:x32 small=arg1:u8",
    "{t}:func_2 a=arg1:s64 b=arg2:s32 raw=arg2",
    "r:{t}:func_2 ret=retval:s64",
    "{t}:named name=+0(arg1):string first=+0(arg2):s32 second=+4(arg2):s16 "
    "flags=+6(arg2):x8 bits=+6(arg2):b3@1/8 bytes=+0(arg2):u8[4] bad=+0(%ax):string",
]
if "char" in RunningKernel.read().grammar.types:
    SPECS.append("{t}:named c=+0(arg1):char cs=+0(arg1):char[3]")


@pytest.mark.parametrize("clock", ["mono", "local"])
def test_text_sink_equals_kernel_trace(loop: Path, clock: str) -> None:
    ours, expected = record_both(
        [s.format(t=loop) for s in SPECS],
        [str(loop), "9", "wait"],
        lambda witness, engine: witness.enable_group(engine.group or ""),
        serial=99,
        clock=clock,
    )
    assert len(ours) == 9 * len(SPECS)
    assert same_but_time(ours) == same_but_time(expected)
    assert ours != same_but_time(ours)
