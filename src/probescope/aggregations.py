"""Aggregations of a live session — the Python API behind `probescope count`, `hist`,
`latency` and `stacks`:

    from probescope.aggregations import count, histogram, latency, stacks
    result = count(["c:malloc", "c:free"], by=["comm"], command=["ls", "-l"])
    print(result.first.counts())

A run resolves the specs, adds to each probe the hidden arguments its keys and values need
(an ABI argument the spec did not fetch, the return value, the stack pointer that pairs
entries with returns, a copy of the stack), picks the engine, and aggregates its events: for
the tracefs engine straight from the ring-buffer records when nothing needs whole events
(`aggregate.records`), else event by event (`aggregate.aggregators`, `aggregate.latency`).
With an interval, the values are handed over and cleared every `interval` seconds; Ctrl-C,
SIGTERM, the end of the command or of `duration` end the run with the values so far.
`recording=FILE` aggregates a recording's events instead, offline (`RecordingAggregation`).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from probescope.aggregate.aggregators import EventAggregator
from probescope.aggregate.in_kernel import KernelReader, kernel_request
from probescope.aggregate.latency import RETURN_VALUE, LatencyAggregator
from probescope.aggregate.maps import Aggregation
from probescope.aggregate.maps_keeper import MapsWatcher
from probescope.aggregate.plan import AggregationError, Plan, Request, key_fields, plan_request
from probescope.aggregate.stack_capture import (
    MAX_SNAPSHOT,
)
from probescope.aggregate.symbolize import ProcessMaps, Symbolizer
from probescope.aggregate.values import Scale
from probescope.engines.aggregation import AggregatingEngine, KernelAggregation
from probescope.engines.base import EngineOptions
from probescope.engines.launch import GatedCommand
from probescope.engines.registry import create_engine
from probescope.errors import EngineUnavailable
from probescope.language.arch import Arch, host_arch
from probescope.language.parse import Spec
from probescope.language.resolved import ResolvedProbe
from probescope.record.recording import Recording
from probescope.record.recording_aggregation import RecordingAggregation
from probescope.session import Session, Terminated, signals_end_session
from probescope.symbols.resolve import resolve_specs
from probescope.system.kernel import RunningKernel

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from probescope.aggregate.records import RecordAggregator

    Aggregator = EventAggregator | LatencyAggregator | RecordAggregator | KernelReader


@dataclass
class RunSummary:
    engine: str
    duration: float
    events: int
    lost: int
    reason: str
    fast_path: bool
    in_kernel: bool
    notes: list[str]
    command_status: int | None


class AggregationRun:
    """One aggregation over one session; `run()` returns the (last interval's) values."""

    def __init__(
        self,
        request: Request,
        *,
        engine: str = "auto",
        pids: Sequence[int] = (),
        command: Sequence[str] | None = None,
        options: EngineOptions | None = None,
        arch: Arch | None = None,
        kernel: RunningKernel | None = None,
        kernel_symbols: Any = None,
        interval: float | None = None,
        existing_children: bool = False,
    ) -> None:
        """`interval`: the run will hand over its values every `interval` seconds (an
        in-kernel aggregation keeps two generations of maps for that); `existing_children`:
        with `pids`, trace the processes they already have too."""
        self.request = request
        self.interval = interval
        self.existing_children = existing_children
        self._notes: list[str] = []
        self.arch = arch or host_arch()
        self.pids = tuple(pids)
        self.command = tuple(command) if command else None
        self.kernel = kernel or RunningKernel.read()
        resolved = resolve_specs(
            list(request.specs),
            pid=pids[0] if len(pids) == 1 else None,
            arch=self.arch,
            grammar=self.kernel.grammar,
        )
        if not resolved:
            raise AggregationError("no probes to aggregate", hint="give at least one probe spec")
        options = options or EngineOptions()
        in_kernel = self._in_kernel_plan(engine, resolved, options)
        self.in_kernel = in_kernel is not None
        if in_kernel is not None:
            planned, aggregation = in_kernel
            self.engine_name = "bpf"
            options = replace(options, aggregation=aggregation)
        else:
            # Kernel stacks are records the engine writes after each event: the engine
            # chosen must be one that can (`auto` passes over those that cannot).
            options = replace(options, kernel_stack="kstack" in key_fields(request, resolved))
            self.engine_name = create_engine(
                engine, resolved, options=options, kernel=self.kernel
            ).name
            planned = plan_request(request, resolved, engine=self.engine_name, arch=self.arch)
        self.planned = planned
        self.fields = planned.fields
        self.plan = planned.keys
        self.stack_options = planned.stacks
        self.returns = planned.returns
        self.probes = planned.probes
        self.options = replace(
            options,
            user_stack="ustack" in self.fields and self.stack_options.kernel_user_walk,
        )
        # With the kernel's engines, stacks of a command are symbolized from maps the keeper
        # copies at its exec and exit (it may have ended when they are read), so the run
        # starts the command itself, gated. (The ptrace engine is its only tracer.)
        self.owns_command = (
            self.command is not None
            and self.engine_name in ("tracefs", "bpf")
            and "ustack" in self.fields
        )
        self._gate: GatedCommand | None = None
        self._keeper: Any = None  # a MapsKeeper while the run owns the command
        self.session = self._session(pids, None if self.owns_command else command)
        needs_kernel = "kstack" in self.fields
        if needs_kernel and kernel_symbols is None:
            from probescope.engines.tracefs.kernel_context import read_kernel_symbols

            kernel_symbols = read_kernel_symbols()
        self.maps = ProcessMaps()
        self.symbolizer = Symbolizer(self.maps, kernel_symbols)
        self.fast_path = False
        self.events = 0
        self.reason = "end"
        self._started = 0.0
        self._watcher: MapsWatcher | None = None
        self._aggregator_used: object = None

    def _in_kernel_plan(
        self, engine: str, resolved: list[ResolvedProbe], options: EngineOptions
    ) -> tuple[Plan, KernelAggregation] | None:
        """The plan and the in-kernel request when the bpf engine can aggregate this here
        (`engine` auto or bpf); else None, with the reason in the notes."""
        if engine not in ("auto", "bpf"):
            return None
        planned = plan_request(self.request, resolved, engine="bpf", arch=self.arch, in_kernel=True)
        wanted = kernel_request(planned, intervals=self.interval is not None)
        reason = wanted if isinstance(wanted, str) else None
        if not isinstance(wanted, str):
            try:
                candidate = create_engine(
                    "bpf", planned.probes, options=options, kernel=self.kernel
                )
            except EngineUnavailable as error:
                reason = error.message
            else:
                if isinstance(candidate, AggregatingEngine):
                    reason = candidate.can_aggregate(wanted, planned.probes)
                else:
                    reason = "the bpf engine does not aggregate"
        if reason is None:
            assert not isinstance(wanted, str)
            return planned, wanted
        self._notes.append(f"aggregated in user space, not in the kernel: {reason}")
        return None

    # -- running ----------------------------------------------------------------------------

    def _aggregator(self) -> Aggregator:
        request = self.request
        name = {"count": "@count", "stacks": "@stacks"}.get(request.kind, f"@{request.of}")
        if request.kind == "latency":
            name = f"@latency_{request.unit}"
        if self.in_kernel:
            aggregating = self.session.engine
            assert isinstance(aggregating, AggregatingEngine)
            intervals = self.interval is not None
            return KernelReader(
                name, self.planned, aggregating, self.symbolizer, intervals=intervals
            )
        if request.kind == "latency":
            return LatencyAggregator(
                name,
                self.plan,
                self.returns,
                unit=request.unit,
                symbolizer=self.symbolizer,
                stacks=self.stack_options,
                keep_spans=request.keep_spans,
            )
        engine: Any = self.session.engine
        retval_arg = RETURN_VALUE if "retval" in self.fields else None
        if request.kind in ("count", "hist") and hasattr(engine, "sub_buffers"):
            from probescope.aggregate.records import RecordAggregator, fast_path_possible

            layout, events = engine.record_layout()
            if fast_path_possible(self.plan, [t for _, t in events.values()], request.of):
                self.fast_path = True
                return RecordAggregator(
                    name,
                    self.plan,
                    layout,
                    events,
                    of=request.of,
                    scale=request.scale,
                    retval_arg=retval_arg,
                    task_of=engine.task_of,
                )
        return EventAggregator(
            name,
            self.plan,
            of=request.of,
            scale=request.scale,
            retval_arg=retval_arg,
            symbolizer=self.symbolizer,
            stacks=self.stack_options,
        )

    def run(
        self,
        *,
        duration: float | None = None,
        interval: float | None = None,
        on_interval: Callable[[Aggregation], None] | None = None,
    ) -> Aggregation:
        """Aggregate until the target ends, `duration` passes, Ctrl-C or SIGTERM. With
        `interval`, `on_interval(values)` gets the values of each interval (then cleared);
        the return value is the last (partial) interval's."""
        aggregator: Aggregator | None = None
        if interval and self.in_kernel and self.interval is None:
            raise AggregationError(
                "this run aggregates in the kernel without intervals",
                hint="give the interval when the run is made: AggregationRun(..., interval=)",
            )
        if interval and self.options.read_interval is None:
            # read the ring buffer often enough that each interval gets its own events
            self.options = replace(self.options, read_interval=min(0.1, interval / 4))
            self.session.options = self.options
        with contextlib.ExitStack() as stack:
            stack.callback(self._end_command)
            stack.callback(lambda: self.session.close())
            stack.callback(self._stop_watcher)
            try:
                with signals_end_session():
                    self._start_session()
                    self._started = time.monotonic()
                    self._start_watcher()
                    stack.enter_context(_collector_quiet())
                    aggregator = self._aggregator_used = self._aggregator()
                    deadline = None if duration is None else self._started + duration
                    next_interval = None if interval is None else self._started + interval
                    interval_started = time.time_ns()
                    for _ in self._feed(aggregator):
                        now = time.monotonic()
                        if next_interval is not None and now >= next_interval:
                            values = self._snapshot(aggregator, interval_started)
                            aggregator.clear()
                            interval_started = time.time_ns()
                            next_interval += interval or 0.0
                            if on_interval is not None:
                                on_interval(values)
                        if deadline is not None and now >= deadline:
                            self.reason = "duration"
                            break
            except KeyboardInterrupt:
                self.reason = "interrupted"
            except Terminated as signal_end:
                self.reason = signal_end.message
            if aggregator is None:
                return Aggregation()
            return self._snapshot(aggregator, interval_started, final=True)
        return Aggregation()  # pragma: no cover - the with block returns

    def _feed(self, aggregator: Aggregator) -> Iterator[None]:
        """Feed the aggregator; yields after each batch so the caller can keep time."""
        engine: Any = self.session.engine
        if isinstance(aggregator, KernelReader):
            for _ in self.session.batches():  # empty: the values are in the kernel
                yield None
            return
        if not isinstance(aggregator, EventAggregator | LatencyAggregator):
            feed = aggregator.feed
            for item in engine.sub_buffers():
                if item is not None:
                    feed(item[1], item[0])
                yield None
            return
        add = aggregator.add_batch
        for batch in self.session.batches():
            if batch.events or batch.lost:
                self.events += len(batch.events)
                add(batch)
            yield None

    def _snapshot(
        self,
        aggregator: Aggregator,
        started_ns: int,
        *,
        final: bool = False,
    ) -> Aggregation:
        if isinstance(aggregator, LatencyAggregator | KernelReader):
            values = aggregator.snapshot(final=final)
        else:
            values = aggregator.snapshot()
        values.started_ns = started_ns
        values.ended_ns = time.time_ns()
        if not isinstance(aggregator, EventAggregator | LatencyAggregator):
            self.events += sum(v for v in values.first.counts().values())
        return values

    def summary(self) -> RunSummary:
        summary = self.session.summary(self.reason)
        stats = summary.stats
        status = summary.command_status
        if self._gate is not None:
            status = self._gate.returncode
        return RunSummary(
            engine=summary.engine,
            duration=time.monotonic() - self._started if self._started else 0.0,
            events=self.events - getattr(self._aggregator_used, "stack_records", 0),
            lost=summary.lost,
            reason=self.reason,
            fast_path=self.fast_path,
            in_kernel=self.in_kernel,
            notes=(list(stats.notes) if stats else []) + self._notes,
            command_status=status,
        )

    def _session(self, pids: Sequence[int], command: Sequence[str] | None) -> Session:
        return Session(
            probes=self.probes,
            engine=self.engine_name,
            pids=pids,
            command=command,
            existing_children=self.existing_children,
            options=self.options,
            kernel=self.kernel,
        )

    def _start_session(self) -> None:
        if not self.owns_command:
            self.session.start()
            return
        assert self.command is not None
        from probescope.aggregate.maps_keeper import MapsKeeper

        self._gate = gate = GatedCommand(self.command)
        pid = gate.start()
        try:
            self._keeper = MapsKeeper(self.maps.add_text)
            if not self._keeper.start(pid):
                self._keeper = None
            self.session = self._session([pid], None)
            self.session.start()
            gate.release()
        except BaseException:
            gate.abort()
            raise

    def _end_command(self) -> None:
        gate = self._gate
        if gate is not None and gate.poll() is None and gate.pid is not None:
            gate.terminate()
            self._notes.append(
                f"{gate.argv[0]} (pid {gate.pid}) was still running: terminated, "
                f"status {gate.returncode}"
            )
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None

    # -- memory maps --------------------------------------------------------------------------

    def _start_watcher(self) -> None:
        if "ustack" not in self.fields:
            return
        engine: Any = self.session.engine
        pids = tuple(getattr(engine, "pids", ()) or self.pids)
        if not pids:
            return
        self._watcher = MapsWatcher(self.maps, pids)
        self._watcher.start()

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None


@contextlib.contextmanager
def _collector_quiet() -> Iterator[None]:
    """Keep the cyclic collector from rescanning the objects a busy run allocates (values and
    events hold no cycles), and give the caller its settings back afterwards."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


# --- the Python API -----------------------------------------------------------------------


class RunOptions(TypedDict, total=False):
    """The keywords every function below takes: what to trace (`engine`, `pids` or a
    `command`), for how long (`duration`), handed over every `interval` seconds to
    `on_interval`; or a `recording` to aggregate instead (then `interval` is recorded time)."""

    engine: str
    pids: Sequence[int]
    command: Sequence[str] | None
    duration: float | None
    interval: float | None
    on_interval: Callable[[Aggregation], None] | None
    recording: str | Path | None


def _run(
    request: Request,
    *,
    engine: str = "auto",
    pids: Sequence[int] = (),
    command: Sequence[str] | None = None,
    duration: float | None = None,
    interval: float | None = None,
    on_interval: Callable[[Aggregation], None] | None = None,
    recording: str | Path | None = None,
) -> Aggregation:
    if recording is not None:
        if engine != "auto" or pids or command or duration:
            raise AggregationError("a recording is aggregated alone: no engine, target or duration")
        with Recording.from_path(recording) as opened:
            aggregation = RecordingAggregation(request, opened)
            return aggregation.run(interval=interval, on_interval=on_interval)
    run = AggregationRun(request, engine=engine, pids=pids, command=command, interval=interval)
    return run.run(duration=duration, interval=interval, on_interval=on_interval)


def _by(by: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(by) if by is not None else None


def count(
    specs: Sequence[str | Spec], *, by: Sequence[str] | None = None, **run: Unpack[RunOptions]
) -> Aggregation:
    """How often each probe fires, per key (default: per probe). `result.first` is the map."""
    return _run(Request("count", tuple(specs), _by(by)), **run)


def histogram(
    specs: Sequence[str | Spec],
    of: str,
    *,
    by: Sequence[str] | None = None,
    scale: Scale | None = None,
    **run: Unpack[RunOptions],
) -> Aggregation:
    """The distribution of argument `of` (log2 buckets, or `scale`), per key."""
    return _run(Request("hist", tuple(specs), _by(by), of=of, scale=scale), **run)


def latency(
    specs: Sequence[str | Spec],
    *,
    by: Sequence[str] | None = None,
    unit: str = "us",
    keep_spans: bool = False,
    stack_method: str = "dwarf",
    **run: Unpack[RunOptions],
) -> Aggregation:
    """How long calls to the functions take (entry and return probes made for you)."""
    request = Request(
        "latency",
        tuple(specs),
        _by(by),
        unit=unit,
        keep_spans=keep_spans,
        stack_method=stack_method,
    )
    return _run(request, **run)


def stacks(
    specs: Sequence[str | Spec],
    *,
    by: Sequence[str] | None = None,
    stack_method: str = "dwarf",
    stack_size: int = MAX_SNAPSHOT,
    **run: Unpack[RunOptions],
) -> Aggregation:
    """How often each call path leads to the probes (default key: the user stack)."""
    request = Request(
        "stacks", tuple(specs), _by(by), stack_method=stack_method, stack_size=stack_size
    )
    return _run(request, **run)


__all__ = [
    "AggregationError",
    "AggregationRun",
    "RecordingAggregation",
    "Request",
    "RunOptions",
    "count",
    "histogram",
    "latency",
    "stacks",
]
