"""Orchestration: specs → resolution → engine → events → sinks, with teardown guaranteed on
every exit path (normal end, exceptions, Ctrl-C, SIGTERM, SIGHUP, a closed output).

While events stream, the first Ctrl-C, SIGTERM or SIGHUP ends the session the way `-d` and
`-n` do: an engine that can (`stop()`) stops recording and delivers what it had recorded
before the stop; a second signal cuts the draining short."""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from probescope.engines.base import Engine, EngineOptions, EngineStats, Target
from probescope.engines.launch import check_command
from probescope.engines.registry import create_engine
from probescope.errors import ProbescopeError
from probescope.events import Event, EventBatch
from probescope.language.arch import Arch
from probescope.language.parse import Spec
from probescope.language.resolved import ResolvedProbe
from probescope.sinks.base import Sink
from probescope.symbols.resolve import resolve_specs
from probescope.system.kernel import RunningKernel

if TYPE_CHECKING:
    from probescope.traceevent.context import KernelContext

if TYPE_CHECKING:
    from probescope.record.recorder import RawRecorder

_TYPE = operator.attrgetter("type")
DRAIN_SECONDS = 5.0  # at most this long delivering what an engine had recorded before a stop


class Terminated(ProbescopeError):
    """probescope received SIGTERM or SIGHUP; the session ends cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def signals_end_session() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into a Terminated exception in the main thread while the
    session runs, so the same `finally` that handles Ctrl-C tears everything down."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def signals_request_stop(request: list[int]) -> Iterator[None]:
    """While events stream: the first SIGINT, SIGTERM or SIGHUP is appended to `request` (the
    session stops and drains at its next batch), a second one ends at once as before."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if request:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(signum)
        request.append(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while a teardown runs, so a second Ctrl-C cannot cut it short."""
    mask = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _collector_quiet() -> Iterator[None]:
    """Events hold no reference cycles: while a session streams, keep the cyclic collector from
    rescanning the millions of objects a busy trace allocates (it halves decode speed)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@dataclass
class Summary:
    """What a session saw, for the report printed at its end."""

    engine: str
    duration: float
    hits: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    stats: EngineStats | None = None
    reason: str = "end"
    # Hits after the session's stop, by event: those the engine counted after it (the
    # kernel's counters run on while the session tears down) and events recorded before it
    # but not shown (past `-n COUNT`).
    after_stop: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.hits.values())

    def unrecorded(self, name: str) -> int:
        """Of the engine's hits of `name`, those neither shown nor after the stop: hits in
        other processes, filtered out, or lost (the kernel counts every hit of a uprobe, in
        every process, before filters)."""
        if self.stats is None or self.stats.hits_title is None or name not in self.stats.hits:
            return 0
        rest = self.stats.hits[name] - self.hits.get(name, 0) - self.after_stop.get(name, 0)
        return max(rest, 0)

    @property
    def command_status(self) -> int | None:
        """Exit code of the command the session started, once it ended (negative: killed by
        that signal)."""
        return self.stats.command_status if self.stats else None

    def exit_status(self) -> int:
        """What `probescope trace` exits with: like strace, the command's own status when it ran
        to its end (128+N when signal N killed it), 128+SIGPIPE when its output was closed (as
        a Unix tool writing into a closed pipe), else 0."""
        if self.reason == OUTPUT_CLOSED:
            return 128 + signal.SIGPIPE
        status = self.command_status
        if self.reason != "end" or status is None:
            return 0
        return status if status >= 0 else 128 - status


Handler = Callable[[Any], Any]
OUTPUT_CLOSED = "output closed"


def _with_children(pids: Sequence[int], existing: bool, notes: list[str]) -> tuple[int, ...]:
    """`pids`, and with `existing` every process already below them; without it, a note
    naming those that will not be traced (the kernel follows only children created later)."""
    from probescope.system.procfs import descendant_processes, read_comm

    chosen = list(dict.fromkeys(pids))
    for pid in list(chosen):
        below = [child for child in descendant_processes(pid) if child not in chosen]
        if not below:
            continue
        if existing:
            chosen += below
            continue
        listing = ", ".join(f"{child} ({read_comm(child)})" for child in below[:8])
        more = f" and {len(below) - 8} more" if len(below) > 8 else ""
        notes.append(
            f"process {pid} ({read_comm(pid)}) already has {len(below)} child "
            f"process{'es' if len(below) > 1 else ''} that will not be traced: {listing}{more}; "
            "add --children to trace them (only children created from now on are followed)"
        )
    return tuple(chosen)


class Session:
    """A tracing session: specs resolved to probes, an engine attached, its events streamed.

        with Session(["bash:readline", "r:bash:readline line=+0($retval):string"]) as s:
            for event in s.events(duration=5):
                print(event.name, event.args)

    or, writing to sinks until the end with teardown and signals handled:

        session = Session(["c:malloc"], command=["ls"])
        summary = session.run([open_sink("text", sys.stdout, context=session.kernel_context())])

    Specs may be text in either form or parsed values. `engine` is `auto`, `tracefs` or
    `ptrace`; `command` starts a program with the probes already armed (the session ends with
    it); `pids` traces running processes and the threads and children they create, and with
    `existing_children` the processes they already have too (nginx's workers under its master:
    without it, `notes` names them). `kernel` is the running kernel as read once (read now when
    not given); `options` what the engine is asked beyond the probes (clock, ring buffer size,
    default filter...).
    """

    def __init__(
        self,
        specs: Sequence[str | Spec] = (),
        *,
        engine: str = "auto",
        pids: Sequence[int] = (),
        command: Sequence[str] | None = None,
        follow_children: bool = True,
        existing_children: bool = False,
        arch: Arch | None = None,
        probes: Sequence[ResolvedProbe] | None = None,
        options: EngineOptions | None = None,
        kernel: RunningKernel | None = None,
    ) -> None:
        if command and pids:
            raise ProbescopeError("give either a command or pids, not both")
        self.kernel = kernel or RunningKernel.read()
        self.notes: list[str] = []  # what resolution left out (globs), said before tracing
        self._resolve = functools.partial(
            resolve_specs,
            pid=pids[0] if len(pids) == 1 else None,
            arch=arch,
            grammar=self.kernel.grammar,
            notes=self.notes,
        )
        self.probes = list(probes) if probes is not None else self._resolve(specs)
        self.target = Target(
            command=tuple(command) if command else None,
            pids=_with_children(pids, existing_children, self.notes),
            follow_children=follow_children,
        )
        self.engine_name = engine
        self.options = options or EngineOptions()
        self.engine: Engine | None = None
        self.handlers: list[tuple[str | Spec, Handler]] = []
        self.hits: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.not_shown: Counter[str] = Counter()  # recorded before the stop, past -n COUNT
        self.lost = 0
        self._stop_request: list[int] = []  # the signal that asked the session to end
        self.engine_notes: list[str] = []  # why `auto` passed engines over, for the summary
        self._started = 0.0
        self._attached = False
        self._closed = False
        self.end_reason = "end"
        self._kernel_context: KernelContext | None = None

    def kernel_context(self) -> KernelContext:
        """What printing this session's events needs from the running kernel (its symbols, BTF
        types and printk strings as far as the probes' kinds need them, its release's printing
        facts), read on first use — before tracing starts, so the first batch does not wait
        for it. Give it to the sinks: `open_sink("text", out, context=session.kernel_context())`."""
        if self._kernel_context is None:
            kinds = {probe.kind for probe in self.probes}
            # Imported on first use: `trace --dry-run` and the API without sinks never need it.
            from probescope.engines.tracefs.kernel_context import read_kernel_context

            self._kernel_context = read_kernel_context(self.kernel, kinds)
        return self._kernel_context

    def on(self, spec: str | Spec, handler: Handler) -> None:
        """Run `handler(ctx)` synchronously at each hit of `spec`, while the thread is stopped
        (ptrace engine). `ctx` reads and writes registers and memory; see docs/ptrace-engine.md."""
        self.handlers.append((spec, handler))

    def prepare(self) -> Engine:
        """Choose and build the engine without attaching it (`auto`: the first that runs here
        and takes every probe; why it passed others over is in `engine_notes`), so that a
        caller can say which it is before tracing starts. start() does it when not done."""
        if self.engine is not None:
            return self.engine
        engine = create_engine(
            self.engine_name if not self.handlers else self._handler_engine(),
            self.probes,
            options=self.options,
            kernel=self.kernel,
            notes=self.engine_notes,
        )
        if self.handlers:
            self._register_handlers(engine)
        if not self.probes:
            raise ProbescopeError("no probes to trace", hint="give at least one probe spec")
        self.engine = engine
        return engine

    def start(self) -> Session:
        if self._attached:
            return self
        engine = self.prepare()
        if self.target.command:
            check_command(self.target.command)  # before the engine touches anything
        self._attached = True
        self._started = time.monotonic()
        try:
            engine.attach(self.probes, self.target)
        except BaseException:
            self.close()
            raise
        return self

    def _handler_engine(self) -> str:
        if self.engine_name not in ("auto", "ptrace"):
            raise ProbescopeError(
                "handlers run only in the ptrace engine", hint="use engine='ptrace' with on()"
            )
        return "ptrace"

    def _register_handlers(self, engine: Engine) -> None:
        register = getattr(engine, "on", None)
        if register is None:
            raise ProbescopeError(f"the {engine.name} engine does not run handlers")
        for spec, handler in self.handlers:
            for probe in self._resolve([spec]):
                match = next(
                    (
                        p
                        for p in self.probes
                        if p.path == probe.path
                        and p.offset == probe.offset
                        and p.kind == probe.kind
                    ),
                    None,
                )
                if match is None:
                    self.probes.append(probe)
                    match = probe
                register(match, handler)

    def events(self, *, duration: float | None = None, count: int | None = None) -> Iterator[Event]:
        """Events in time order until the target ends, `duration` seconds pass, `count` events
        arrived, or close() is called."""
        for batch in self.batches(duration=duration, count=count):
            yield from batch.events

    def batches(
        self, *, duration: float | None = None, count: int | None = None
    ) -> Iterator[EventBatch]:
        """Like events(), a batch at a time (what the engine decoded together; empty batches
        mark idle moments) — the cheap path for sinks and counters.

        At the end (`duration`, `count`, a signal while run() streams), an engine that can
        stop stops recording and what it recorded before is still delivered (past `count`:
        counted as not shown), for at most DRAIN_SECONDS."""
        self.start()
        assert self.engine is not None
        deadline = None if duration is None else self._started + duration
        seen = 0
        hits, kinds = self.hits, self.kinds
        drain_until: float | None = None  # set once stopped: delivering what was recorded
        for item in self.engine.events():
            batch = item if isinstance(item, EventBatch) else EventBatch([item])
            if batch.lost:
                self.lost += max(batch.lost, 1)
            events = batch.events
            if count is not None and seen + len(events) >= count:
                self._not_shown(events[count - seen :])
                events = events[: count - seen]
                batch = EventBatch(events, batch.lost, batch.cpu)
            for event_type, hits_of_type in Counter(map(_TYPE, events)).items():
                hits[f"{event_type.group}/{event_type.name}"] += hits_of_type
                kinds[event_type.kind.value] += hits_of_type
            seen += len(events)
            if events or batch.lost or drain_until is None:
                yield batch
            if drain_until is not None:
                if time.monotonic() >= drain_until:
                    return
                continue
            reason = self._end_reason(seen, count, deadline)
            if reason is None:
                continue
            self.end_reason = reason
            stop = getattr(self.engine, "stop", None)
            if stop is None:
                return
            stop()
            drain_until = time.monotonic() + DRAIN_SECONDS

    def _end_reason(self, seen: int, count: int | None, deadline: float | None) -> str | None:
        if count is not None and seen >= count:
            return f"{count} events"
        if deadline is not None and time.monotonic() >= deadline:
            return "duration"
        if self._stop_request:
            signum = self._stop_request[0]
            return "interrupted" if signum == signal.SIGINT else Terminated(signum).message
        return None

    def _not_shown(self, events: Sequence[Event]) -> None:
        for event_type, number in Counter(map(_TYPE, events)).items():
            self.not_shown[f"{event_type.group}/{event_type.name}"] += number

    def run(
        self,
        sinks: Sequence[Sink] = (),
        *,
        duration: float | None = None,
        count: int | None = None,
    ) -> Summary:
        """Attach, stream every batch into `sinks` until the target ends, `duration` seconds
        pass, `count` events arrived, Ctrl-C, SIGTERM or SIGHUP (what was recorded before is
        still delivered), or a sink's reader goes away (BrokenPipeError: reason
        OUTPUT_CLOSED); then close the sinks, detach and return the summary (its `reason` says
        which end it was). Teardown runs on every exit path, exceptions from a sink
        included."""
        reason = "end"
        try:
            with signals_end_session(), _collector_quiet():
                try:
                    self.start()
                    with signals_request_stop(self._stop_request):
                        for batch in self.batches(duration=duration, count=count):
                            if batch.events or batch.lost:
                                for sink in sinks:
                                    sink.write_batch(batch)
                            for sink in sinks:
                                sink.flush()  # idle too: a sink notices its reader left
                    reason = self.end_reason
                except KeyboardInterrupt:
                    reason = "interrupted"
                except Terminated as signal_end:
                    reason = signal_end.message
                except BrokenPipeError:
                    reason = OUTPUT_CLOSED
                finally:
                    try:
                        for sink in sinks:
                            with contextlib.suppress(BrokenPipeError):
                                sink.close()
                    finally:
                        self.close()
        finally:
            self.close()
        return self.summary(reason)

    def record_raw(self, recorder: RawRecorder, *, duration: float | None = None) -> Summary:
        """Attach and copy the engine's raw sub-buffers into `recorder`, decoding nothing,
        until the target ends, `duration` seconds pass, Ctrl-C, SIGTERM or SIGHUP; the ring
        buffer is then emptied into it and, before the engine detaches, the recording is
        finished with the instance's files. Needs an engine with raw sub-buffers (tracefs).
        Teardown runs on every exit path; a recording cut short by an error is not written."""
        reason = "end"
        try:
            with signals_end_session():
                try:
                    self.start()
                    engine = self.engine
                    stream = getattr(engine, "sub_buffers", None)
                    if stream is None or engine is None:
                        raise ProbescopeError(
                            f"the {self.engine_name} engine has no raw sub-buffers to record"
                        )
                    deadline = None if duration is None else self._started + duration
                    try:
                        for item in stream():
                            if item is None:
                                recorder.poll()
                                if deadline is not None and time.monotonic() >= deadline:
                                    reason = "duration"
                                    engine.end()  # type: ignore[attr-defined]
                                    deadline = None
                                continue
                            recorder.write_sub_buffer(*item)
                    except (KeyboardInterrupt, Terminated) as stop:
                        reason = (
                            "interrupted" if isinstance(stop, KeyboardInterrupt) else (stop.message)
                        )
                        with signals_deferred():
                            engine.end()  # type: ignore[attr-defined]
                            for item in stream():
                                if item is not None:
                                    recorder.write_sub_buffer(*item)
                    with signals_deferred():
                        types = engine.event_types()  # type: ignore[attr-defined]
                        recorder.finish(
                            engine.instance_files(),  # type: ignore[attr-defined]
                            types,
                            [t.format for t in types.values() if t.format is not None],
                            lost=engine.stats().lost,
                        )
                finally:
                    recorder.close()
                    self.close()
        finally:
            self.close()
        return self.summary(reason)

    def close(self) -> None:
        """Detach the engine and restore everything it changed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.engine is not None and self._attached:
            with signals_deferred():
                self.engine.detach()

    def summary(self, reason: str = "end") -> Summary:
        stats = self.engine.stats() if self.engine is not None else None
        if stats is not None:
            stats.notes[:0] = [note for note in self.engine_notes if note not in stats.notes]
        lost = stats.lost if stats else self.lost
        after_stop = Counter(self.not_shown)
        if stats is not None:
            after_stop.update(stats.hits_after_stop)
        return Summary(
            engine=self.engine.name if self.engine else self.engine_name,
            duration=time.monotonic() - self._started if self._started else 0.0,
            hits=Counter(self.hits),
            kinds=Counter(self.kinds),
            lost=lost,
            stats=stats,
            reason=reason,
            after_stop=after_stop,
        )

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
