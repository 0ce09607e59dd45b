"""A probescope tracer in its own process, for tests that kill it or run it as another user.

usage: tracer_driver.py PROGRAM SYMBOL OUTPUT [--pid PID]
Traces PROGRAM (started with stdout redirected to OUTPUT) or the running process PID, with an
entry probe on SYMBOL. Prints "attached" once probes are in, then one "event N" line per hit.
SIGTERM calls engine.detach() from the signal handler, then exits with status 0.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration.ptrace.harness import make_probe
from probescope.engines.base import Target
from probescope.engines.ptrace import PtraceEngine
from probescope.events import EventBatch


def main(argv: list[str]) -> int:
    program, symbol, output = argv[:3]
    pid = int(argv[4]) if len(argv) > 4 and argv[3] == "--pid" else None
    engine = PtraceEngine()

    def on_term(signum: int, frame: object) -> None:
        engine.detach()
        os.write(1, b"detached\n")  # print() may be what the signal interrupted
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    probe = make_probe(program, symbol, "a=%di:s64")
    if pid is None:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        saved = os.dup(1)
        os.dup2(fd, 1)
        try:
            engine.attach([probe], Target(command=(program,)))
        finally:
            os.dup2(saved, 1)
            os.close(fd)
            os.close(saved)
    else:
        engine.attach([probe], Target(pids=(pid,)))
    print("attached", flush=True)
    count = 0
    for item in engine.events():
        if isinstance(item, EventBatch):
            continue
        count += 1
        print(f"event {count} {item.arg('a')} tid={item.tid}", flush=True)
    print(f"finished exit={engine.exit_code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
