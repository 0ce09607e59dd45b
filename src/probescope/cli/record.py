"""`probescope record SPEC... -o FILE`: trace like `trace`, into a trace.dat that `probescope
report`, `trace-cmd report` and KernelShark read.

With the tracefs engine (what `auto` picks for recording when it can run the probes) the
kernel's sub-buffers are written as they come, decoded by nobody, so the recorder keeps up at
the kernel's full rate like `trace-cmd record`; `-n COUNT` needs events counted, so it decodes.
Other engines record their events through synthesized formats.

`--stack` has the kernel record the user stack after every uprobe event (tracefs only: the
other engines refuse it); its frame-pointer walk misses the caller of a function probed at its
entry (the frame is not made yet), so such a probe also fetches its return address, `$stack0`,
as `__ps_ret` — what `stacks --input` puts back, as the live `--stack-method fp` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from probescope.aggregate.maps_keeper import MapsKeeper
from probescope.aggregate.stack_capture import RETURN_ADDRESS, with_arguments
from probescope.cli import trace
from probescope.cli._console import console as make_console
from probescope.cli.session_options import check_output_path, command_argv, engine_options
from probescope.engines.registry import BY_NAME, availability
from probescope.engines.tracefs.instance_files import read_kallsyms_text
from probescope.errors import RecordingError
from probescope.language.resolved import ResolvedProbe
from probescope.record.facts import RecordingFacts
from probescope.record.processes import ProcessWatcher
from probescope.record.recorder import (
    KINDS_WITH_KALLSYMS,
    EventRecorder,
    RawRecorder,
    probe_facts,
)
from probescope.session import Session, Summary
from probescope.system.kernel import RunningKernel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(parser, outputs=False)
    parser.add_argument(
        "-o", "--output", default="trace.dat", metavar="FILE", help="the file (trace.dat)"
    )


def run(args: argparse.Namespace) -> int:
    kernel = RunningKernel.read()
    if args.dry_run:
        return trace.run(args)
    check_output_path(args.output)
    engine = args.engine
    session = Session(
        args.specs,
        engine=engine,
        pids=args.pid,
        existing_children=args.children,
        command=command_argv(args.command),
        options=engine_options(args),
        kernel=kernel,
    )
    if engine == "auto":
        session.engine_name = recording_engine(session, kernel)
    if args.stack:
        refuse_stackless(session.engine_name)
    if args.stack and session.engine_name == "tracefs":
        session.probes = [with_return_address(probe) for probe in session.probes]
    if not args.quiet:
        for note in session.notes:
            print(f"note: {note}", file=sys.stderr)
    context = session.kernel_context()
    kinds = {probe.kind for probe in session.probes}
    kallsyms = read_kallsyms_text() if kinds & KINDS_WITH_KALLSYMS else b""
    spawned = CommandMaps(session.target.follow_children, args.clock)
    if args.stack:  # the stacks' addresses need the maps of every moment
        session.target = dataclasses.replace(session.target, on_spawn=spawned)
    try:
        session.start()
    except BaseException:
        spawned.stop()
        raise
    try:
        assert session.engine is not None
        if args.stack:
            refuse_stackless(session.engine.name)
        facts = RecordingFacts(engine=session.engine.name, probes=probe_facts(session.probes))
        watcher = spawned.watcher
        pids = tuple(getattr(session.engine, "pids", ()) or session.target.pids)
        if watcher is None and pids:
            watcher = ProcessWatcher(
                pids, follow_children=session.target.follow_children, clock=args.clock
            )
        if watcher is not None:
            watcher.sample()
    except BaseException:
        spawned.stop()
        session.close()
        raise
    raw = session.engine.name == "tracefs" and args.count is None
    if raw:
        recorder = RawRecorder(
            args.output,
            facts=facts,
            context=context,
            watcher=watcher,
            kallsyms=kallsyms,
            user_stacks=args.stack,
        )
        summary = session.record_raw(recorder, duration=args.duration)
        size, detail = recorder.size, f"{recorder.sub_buffers} sub-buffers, undecoded"
    else:
        sink = EventRecorder(
            args.output,
            facts=facts,
            context=context,
            watcher=watcher,
            kallsyms=kallsyms,
            clock=args.clock,
        )
        summary = session.run([sink], duration=args.duration, count=args.count)
        size, detail = sink.size, f"{sink.events} events"
    if not args.quiet:
        print_recorded(summary, args.output, size, detail, raw)
    return summary.exit_status()


class CommandMaps:
    """The `on_spawn` of a command recorded with --stack (tracefs starts it gated): a
    ProcessWatcher of it, fed by a MapsKeeper with its maps at each exec and exit — a command
    shorter than the watcher's sampling interval (or a shim that execs the real program) would
    leave no maps of its libraries in the file otherwise. Where ptrace is refused the watcher
    samples alone."""

    def __init__(self, follow_children: bool, clock: str) -> None:
        self.follow_children = follow_children
        self.clock = clock
        self.watcher: ProcessWatcher | None = None
        self.keeper: MapsKeeper | None = None

    def __call__(self, pid: int) -> None:
        watcher = ProcessWatcher([pid], follow_children=self.follow_children, clock=self.clock)
        keeper = MapsKeeper(watcher.add_maps_text)
        if keeper.start(pid):
            self.keeper = keeper
            watcher.keep_maps_with(keeper)
        self.watcher = watcher

    def stop(self) -> None:
        """End the keeper when the recording is abandoned (final() ends it otherwise)."""
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None


def recording_engine(session: Session, kernel: RunningKernel) -> str:
    """The engine `auto` records with: tracefs when it runs here and takes every probe (its
    sub-buffers are written undecoded), else what `auto` picks for tracing."""
    entry = BY_NAME["tracefs"]
    kinds = {probe.kind for probe in session.probes}
    if kinds <= entry.kinds and availability(entry, kernel).ok:
        return "tracefs"
    return "auto"


def refuse_stackless(engine: str) -> None:
    """--stack with an engine that records no stack records is an error, never a recording
    without the stacks asked for (bpf and ptrace refuse it themselves)."""
    if engine not in ("tracefs", "auto"):
        raise RecordingError(
            f"the {engine} engine records no stacks (--stack)",
            hint="the tracefs engine records them (the kernel's userstacktrace): --engine tracefs",
        )


def with_return_address(probe: ResolvedProbe) -> ResolvedProbe:
    """A uprobe at a function's entry fetching its return address too (see the module)."""
    if probe.kind.is_user and not probe.kind.is_return and probe.on_function_entry:
        return with_arguments(probe, [f"{RETURN_ADDRESS}=$stack0:x64"])
    return probe


def print_recorded(summary: Summary, output: str, size: int, detail: str, raw: bool) -> None:
    """`trace`'s summary (for an undecoded recording: the kernel's hit counts, no event
    count), then what was written."""
    console = make_console(sys.stderr, soft_wrap=True, highlight=False)
    if not raw:
        trace.print_summary(summary, sys.stderr)
    else:
        console.print(
            f"probescope: recorded for {summary.duration:.2f}s ({summary.engine} engine, "
            f"{summary.reason}); lost {summary.lost}"
        )
        stats = summary.stats
        if stats is not None:
            for name, hits in sorted(stats.hits.items()):
                console.print(f"  {name}: {hits} {stats.hits_title or 'hits'}")
            for note in stats.notes:
                console.print(f"note: {note}")
        if summary.command_status is not None:
            console.print(f"command exited with status {summary.command_status}")
    if size:
        console.print(f"recorded {output}: {size} bytes ({detail})")
    else:
        console.print(f"nothing recorded: {output} was not written")
