"""Recorders: a session written into a trace.dat as it runs.

`RawRecorder` takes the tracefs engine's sub-buffers as the kernel wrote them and decodes
nothing: each is appended to its CPU's file (unlinked, beside the output), like trace-cmd's
per-CPU recorders. `EventRecorder` is a sink for every other engine: events become records of
synthesized formats (`synthesis`), packed into sub-buffers per CPU. Both end the same way: the
instance's self-descriptions and probescope's facts in front, the CPU files copied behind
(`tracedat_writer`), written to a temporary name and renamed, so a file at the output path is
always whole.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from probescope import __version__
from probescope.engines.tracefs.instance_files import InstanceFiles
from probescope.errors import RecordingError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.record.facts import RecordingFacts
from probescope.record.processes import ProcessWatcher
from probescope.record.synthesis import HEADER_EVENT, HEADER_PAGE, EventEncoder, SubBufferPacker
from probescope.record.tracedat import (
    OPTION_CPUCOUNT,
    OPTION_CPUSTAT,
    OPTION_PROBESCOPE,
    OPTION_TRACECLOCK,
    OPTION_UNAME,
    OPTION_VERSION,
)
from probescope.record.tracedat_writer import CpuSource, TraceDatContents, write_tracedat
from probescope.traceevent.context import KernelContext
from probescope.traceevent.format import EventFormat, parse_saved_tgids

_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
KINDS_WITH_KALLSYMS = frozenset(
    {ProbeKind.KPROBE, ProbeKind.KRETPROBE, ProbeKind.FUNCTION, ProbeKind.TRACEPOINT}
)


class _CpuFiles:
    """One unlinked file per CPU beside the output, filled with whole sub-buffers."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fds: dict[int, int] = {}
        self.sizes: dict[int, int] = {}

    def append(self, cpu: int, data: bytes) -> None:
        fd = self.fds.get(cpu)
        if fd is None:
            with tempfile.TemporaryFile(dir=self.directory, prefix=".probescope-cpu") as spare:
                fd = self.fds[cpu] = os.dup(spare.fileno())
            self.sizes[cpu] = 0
        view = memoryview(data)
        while view:
            try:
                done = os.write(fd, view)
            except InterruptedError:
                continue
            except OSError as error:
                raise RecordingError(
                    f"cannot write the recording's data in {self.directory}: {error.strerror}"
                ) from None
            view = view[done:]
            self.sizes[cpu] += done

    def sources(self, cpus: int) -> list[CpuSource]:
        return [
            CpuSource(fd=self.fds[cpu], size=self.sizes[cpu]) if cpu in self.fds else CpuSource()
            for cpu in range(cpus)
        ]

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def _write_file(output: Path, contents: TraceDatContents, sources: Sequence[CpuSource]) -> int:
    """Write the trace.dat under a temporary name beside `output`, then rename it."""
    temporary = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        stream: IO[bytes]
        with open(temporary, "wb") as stream:
            size = write_tracedat(stream, contents, sources)
        os.replace(temporary, output)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise RecordingError(f"cannot write {str(output)!r}: {error.strerror}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return size


def probe_facts(probes: Iterable[ResolvedProbe]) -> list[dict[str, object]]:
    """The session's probes as the facts keep them."""
    return [
        {
            "event": probe.spec.event_name if isinstance(probe.spec, ProbeSpec) else None,
            "definition": probe.spec.definition()
            if isinstance(probe.spec, ProbeSpec)
            else str(probe.spec),
            "kind": str(probe.kind),
            "path": probe.path,
            "offset": probe.offset,
            "symbol": probe.symbol,
            "build_id": probe.build_id,
        }
        for probe in probes
    ]


def _kernel_facts(
    facts: RecordingFacts, context: KernelContext, formats: Iterable[EventFormat]
) -> None:
    """Release, printing facts, and the enum constants and typedefs the print fmts name."""
    facts.release = context.release
    facts.hash_pointers = context.hash_pointers
    facts.lazy_resched = context.lazy_resched
    facts.irqflags_support = context.irqflags_support
    names: set[str] = set()
    for event_format in formats:
        names.update(_IDENTIFIER.findall(event_format.print_fmt))
    enums = dict(context.types.enums) if context.types is not None else {}
    enums.update(context.enums)
    typedefs = context.types.typedefs if context.types is not None else {}
    facts.enums = {name: enums[name] for name in sorted(names) if name in enums}
    facts.typedefs = {name: typedefs[name] for name in sorted(names) if name in typedefs}


def _options(
    facts: RecordingFacts, trace_clock: str, cpus: int, stats: Mapping[int, str]
) -> list[tuple[int, bytes]]:
    uname = os.uname()
    options = [
        (OPTION_TRACECLOCK, trace_clock.strip().encode() + b"\0"),
        (
            OPTION_UNAME,
            f"{uname.sysname} {uname.nodename} {uname.release} {uname.version} "
            f"{platform.machine()}".encode()
            + b"\0",
        ),
        (OPTION_CPUCOUNT, cpus.to_bytes(4, "little")),
        (OPTION_VERSION, f"probescope {__version__}".encode() + b"\0"),
    ]
    for cpu, text in sorted(stats.items()):
        options.append((OPTION_CPUSTAT, f"CPU: {cpu}\n{text}".encode() + b"\0"))
    options.append((OPTION_PROBESCOPE, facts.to_option()))
    return options


class RawRecorder:
    """Sub-buffers of the tracefs engine into `output`, undecoded; `finish` writes the file.

    `facts` starts with what the session knows (engine, probes); `watcher` samples the traced
    processes; `context` gives the kernel's printing facts and BTF; `kallsyms` the text of
    /proc/kallsyms when the events print kernel symbols."""

    def __init__(
        self,
        output: str | Path,
        *,
        facts: RecordingFacts,
        context: KernelContext,
        watcher: ProcessWatcher | None = None,
        kallsyms: bytes = b"",
        user_stacks: bool = False,
    ) -> None:
        self.output = Path(output)
        self.facts = facts
        self.context = context
        self.watcher = watcher
        self.kallsyms = kallsyms
        self.user_stacks = user_stacks
        self.sub_buffers = 0
        self._files = _CpuFiles(self.output.resolve().parent)
        self.size = 0

    def write_sub_buffer(self, cpu: int, data: bytes) -> None:
        self._files.append(cpu, data)
        self.sub_buffers += 1

    def poll(self) -> None:
        if self.watcher is not None:
            self.watcher.poll()

    def finish(
        self,
        files: InstanceFiles,
        event_types: Mapping[int, EventType],
        formats: Sequence[EventFormat],
        *,
        lost: int = 0,
    ) -> int:
        """Write the file from the instance's files and the session's event types and formats;
        returns its size."""
        facts = self.facts
        if self.watcher is not None:
            self.watcher.final()
            facts.comms.update(self.watcher.comms)
            facts.tgids.update(self.watcher.tgids)
            facts.processes = self.watcher.maps
            facts.files = self.watcher.files(with_functions=self.user_stacks)
        for tid, tgid in parse_saved_tgids(files.saved_tgids).items():
            facts.tgids.setdefault(tid, tgid)
        facts.describe_events(event_types)
        facts.clock = _bracketed(files.trace_clock) or facts.clock
        facts.lost = lost
        _kernel_facts(facts, self.context, formats)
        cpus = max([*files.cpu_stats, *self._files.fds, 0]) + 1
        contents = TraceDatContents(
            header_page=files.header_page.encode(),
            header_event=files.header_event.encode(),
            ftrace_formats=[t.encode() for s, t in files.formats if s == "ftrace"],
            event_formats=[(s, t.encode()) for s, t in files.formats if s != "ftrace"],
            kallsyms=self.kallsyms,
            printk_formats=files.printk_formats.encode("utf-8", "surrogateescape"),
            saved_cmdlines=files.saved_cmdlines.encode("utf-8", "surrogateescape"),
            options=_options(facts, files.trace_clock, cpus, files.cpu_stats),
            page_size=files.sub_buffer_size,
        )
        try:
            self.size = _write_file(self.output, contents, self._files.sources(cpus))
        finally:
            self._files.close()
        return self.size

    def close(self) -> None:
        self._files.close()


class EventRecorder:
    """A sink that records the events of any engine into `output` (see the module's docstring);
    `close()` writes the file."""

    def __init__(
        self,
        output: str | Path,
        *,
        facts: RecordingFacts,
        context: KernelContext,
        watcher: ProcessWatcher | None = None,
        kallsyms: bytes = b"",
        clock: str = "mono",
    ) -> None:
        self.output = Path(output)
        self.facts = facts
        self.context = context
        self.watcher = watcher
        self.kallsyms = kallsyms
        self.clock = clock
        self.events = 0
        self.size = 0
        self._encoder = EventEncoder()
        self._packers: dict[int, SubBufferPacker] = {}
        self._files = _CpuFiles(self.output.resolve().parent)
        self._closed = False

    def _packer(self, cpu: int) -> SubBufferPacker:
        packer = self._packers.get(cpu)
        if packer is None:
            packer = self._packers[cpu] = SubBufferPacker()
        return packer

    def write(self, event: Event) -> None:
        self.write_batch(EventBatch([event]))

    def write_batch(self, batch: EventBatch) -> None:
        if batch.lost:
            cpu = batch.cpu if batch.cpu is not None else 0
            for page in self._packer(cpu).lose(batch.lost):
                self._files.append(cpu, page)
        encode, comms, tgids = self._encoder.encode, self.facts.comms, self.facts.tgids
        for event in batch.events:
            cpu = max(event.cpu, 0)
            for page in self._packer(cpu).add(event.timestamp_ns, encode(event)):
                self._files.append(cpu, page)
            comms[event.tid] = event.comm
            tgids[event.tid] = event.pid
        self.events += len(batch.events)

    def flush(self) -> None:
        if self.watcher is not None:
            self.watcher.poll()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for cpu, packer in self._packers.items():
                page = packer.flush()
                if page:
                    self._files.append(cpu, page)
            self.size = self._write()
        finally:
            self._files.close()

    def _write(self) -> int:
        facts = self.facts
        if self.watcher is not None:
            self.watcher.final()
            for tid, comm in self.watcher.comms.items():
                facts.comms.setdefault(tid, comm)
            for tid, tgid in self.watcher.tgids.items():
                facts.tgids.setdefault(tid, tgid)
            facts.processes = self.watcher.maps
            facts.files = self.watcher.files(with_functions=False)
        event_types = self._encoder.event_types
        facts.describe_events(event_types)
        facts.clock = self.clock
        formats = [t.format for t in event_types.values() if isinstance(t.format, EventFormat)]
        _kernel_facts(facts, self.context, formats)
        texts = self._encoder.formats
        kinds = {t.kind for t in event_types.values()}
        cpus = max([*self._files.fds, 0]) + 1
        cmdlines = "".join(f"{tid} {comm}\n" for tid, comm in sorted(facts.comms.items()))
        contents = TraceDatContents(
            header_page=HEADER_PAGE.encode(),
            header_event=HEADER_EVENT.encode(),
            ftrace_formats=[t.encode() for s, t in texts if s == "ftrace"],
            event_formats=[(s, t.encode()) for s, t in texts if s != "ftrace"],
            kallsyms=self.kallsyms if kinds & KINDS_WITH_KALLSYMS else b"",
            saved_cmdlines=cmdlines.encode("utf-8", "surrogateescape"),
            options=_options(facts, f"[{self.clock}]", cpus, {}),
        )
        return _write_file(self.output, contents, self._files.sources(cpus))


def _bracketed(text: str) -> str | None:
    if "[" in text and "]" in text:
        return text.split("[", 1)[1].split("]", 1)[0]
    return text.strip() or None
