"""Our text lines are the kernel's lines: the same events recorded in a witness instance are
printed by the kernel's own `trace` file and compared byte for byte with the text sink."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest

from probescope.engines.tracefs.engine import TracefsEngine
from probescope.engines.tracefs.instance import Instance
from probescope.engines.tracefs.ownership import Owner
from probescope.engines.tracefs.tracefs import Tracefs, running_kernel_grammar
from probescope.session import Session
from probescope.sinks.base import open_sink

pytestmark = pytest.mark.root

SPECS = [
    "{t}:func_1 a=arg1:s32 hex=arg1:x32 small=arg1:u8",
    "{t}:func_2 a=arg1:s64 b=arg2:s32 raw=arg2",
    "r:{t}:func_2 ret=retval:s64",
    "{t}:named name=+0(arg1):string first=+0(arg2):s32 second=+4(arg2):s16 "
    "flags=+6(arg2):x8 bits=+6(arg2):b3@1/8 bytes=+0(arg2):u8[4] bad=+0(%ax):string",
]
if "char" in running_kernel_grammar().types:
    SPECS.append("{t}:named c=+0(arg1):char cs=+0(arg1):char[3]")


_TIMESTAMP = re.compile(r"(?<= )\d+\.\d{6}(?=: )")


def same_but_time(lines: list[str]) -> list[str]:
    """Each instance stamps its own copy of an event a few hundred ns apart: keep the
    timestamp's shape (width, precision) and drop its digits."""
    return [_TIMESTAMP.sub(lambda m: re.sub(r"\d", "9", m.group()), line) for line in lines]


def kernel_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("clock", ["mono", "local"])
def test_text_sink_equals_kernel_trace(loop: Path, clock: str) -> None:
    proc = subprocess.Popen([str(loop), "9", "wait"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    specs = [s.format(t=loop) for s in SPECS]
    out = io.StringIO()
    sink = open_sink("text", out)
    session = Session(specs, engine="tracefs", pids=[proc.pid], engine_options={"clock": clock})
    witness = None
    try:
        session.start()
        engine = session.engine
        assert isinstance(engine, TracefsEngine) and engine.group is not None
        tracefs = Tracefs.discover()
        witness = Instance.create(tracefs, Owner.current().instance_name(99))
        witness.set_clock(clock)
        witness.set_event_pids([proc.pid])
        witness.enable_group(engine.group)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        for event in session.events(duration=20):
            sink.write(event)
        sink.close()
        expected = kernel_lines(witness.read("trace"))
    finally:
        if witness is not None:
            witness.remove()
        session.close()
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    ours = out.getvalue().splitlines()
    assert len(ours) == 9 * len(SPECS)
    assert same_but_time(ours) == same_but_time(expected)
    assert ours != same_but_time(ours)
