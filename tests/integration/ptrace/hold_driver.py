"""A tracer that stops inside a hit and stays there, for tests that kill it at that moment.

usage: hold_driver.py PROGRAM PID entry|return
Attaches to PID with an entry and a return probe on `mix`; at the first hit of the chosen kind
a handler prints "holding" and sleeps, so the thread stays stopped on our trap (the entry's
trap byte, or the trampoline) with nothing served yet, until this process is killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration.ptrace.harness import make_probe
from probescope.engines.base import Target
from probescope.engines.ptrace import HitContext, PtraceEngine


def main(argv: list[str]) -> int:
    program, pid, kind = argv[0], int(argv[1]), argv[2]
    entry = make_probe(program, "mix", "a=%di:s64")
    ret = make_probe(program, "mix", "r=$retval:s64", kind="r", event="mix_ret")
    engine = PtraceEngine()

    def hold(ctx: HitContext) -> None:
        print("holding", flush=True)
        while True:
            time.sleep(1)

    engine.on(entry if kind == "entry" else ret, hold)
    engine.attach([entry, ret], Target(pids=(pid,)))
    for _ in engine.events():
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
