"""Every kernel object a bpf session holds — links, perf events, programs, maps, the ring — and
how each is made: programs loaded (a verifier refusal names the probe and shows the log's last
lines), uprobe groups attached with one uprobe_multi link per binary (or a PMU event per
probe), tracepoint perf events, the fork/exit tracker that keeps the pid map. `close()` undoes
it all, links first (that removes the breakpoints). The record engine and in-kernel
aggregations both build on it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import BPF_F_SLEEPABLE
from probescope.engines.bpf.attach import (
    ProbePoint,
    attach_to_perf_event,
    attach_uprobe_multi,
    open_tracepoint_event,
    open_uprobe_event,
    uprobe_pmu_type,
)
from probescope.engines.bpf.maps import BpfMap
from probescope.engines.bpf.program import ProgramImage
from probescope.engines.bpf.ringbuf import RingBuffer
from probescope.engines.bpf.tracepoints import build_exit_program, build_fork_program
from probescope.errors import ProbescopeError, VerifierError
from probescope.language.resolved import ResolvedProbe

MapT = TypeVar("MapT", bound=BpfMap)


@dataclass
class Attachments:
    """What a session created, closed in reverse order by `close()`."""

    links: list[int] = field(default_factory=list)
    perf_events: list[int] = field(default_factory=list)
    trackers: list[int] = field(default_factory=list)  # the fork/exit tracker's attachments
    closing: list[threading.Thread] = field(default_factory=list)  # closes running apart
    programs: list[int] = field(default_factory=list)
    maps: list[BpfMap] = field(default_factory=list)
    ring: RingBuffer | None = None
    images: list[ProgramImage] = field(default_factory=list)

    def own(self, bpf_map: MapT) -> MapT:
        """Keep `bpf_map` to close with the rest."""
        self.maps.append(bpf_map)
        return bpf_map

    def load(self, image: ProgramImage, label: str) -> int:
        """Load `image` (the program of `label`, named in a verifier refusal)."""
        try:
            fd = syscall.prog_load(
                image.program_type,
                image.instructions,
                name=image.name,
                expected_attach_type=image.expected_attach_type,
                flags=BPF_F_SLEEPABLE if image.sleepable else 0,
                functions=image.functions,
            )
        except VerifierError as error:
            raise VerifierError(
                f"the kernel's verifier rejected the program for {label}: {error.message}",
                errno=error.errno,
                log=error.log,
                hint="verifier's last lines:\n" + _last_lines(error.log),
            ) from None
        self.programs.append(fd)
        self.images.append(image)
        return fd

    def attach_tracepoint(
        self, program_fd: int, event_id: int, label: str, *, tracker: bool = False
    ) -> None:
        perf_fd = open_tracepoint_event(event_id, label)
        (self.trackers if tracker else self.perf_events).append(perf_fd)
        link = attach_to_perf_event(program_fd, perf_fd)
        if link is not None:
            (self.trackers if tracker else self.links).append(link)

    def attach_uprobes(
        self,
        program_fd: int,
        members: Sequence[tuple[int, ResolvedProbe]],
        *,
        return_probe: bool,
        mode: str,
    ) -> None:
        """Attach one program to probes (index, probe): one uprobe_multi link per binary with
        each probe's index as its cookie (`mode` multi), or a PMU event per probe."""
        paths: dict[str, list[ProbePoint]] = {}
        for index, probe in members:
            assert probe.path is not None
            paths.setdefault(probe.path, []).append(
                ProbePoint(probe.offset or 0, index, probe.ref_ctr_offset or 0)
            )
        for path, points in paths.items():
            if mode == "multi":
                self.links.append(
                    attach_uprobe_multi(program_fd, path, points, return_probe=return_probe)
                )
                continue
            pmu_type = uprobe_pmu_type()
            assert pmu_type is not None
            for point in points:
                perf_fd = open_uprobe_event(pmu_type, path, point, return_probe=return_probe)
                self.perf_events.append(perf_fd)
                link = attach_to_perf_event(program_fd, perf_fd, cookie=point.index)
                if link is not None:
                    self.links.append(link)

    def follow_pids(
        self, pid_map: BpfMap, pids: Sequence[int], *, children: bool, notes: list[str]
    ) -> None:
        """Put `pids` in the pid map; with `children`, keep it following their forks and
        exits (programs on sched_process_fork/exit, the tracefs engine's `event-fork`)."""
        for pid in pids:
            pid_map.update(struct.pack("<I", pid), struct.pack("<Q", 1))
        if not children:
            return
        try:
            from probescope.engines.tracefs.tracefs import Tracefs
            from probescope.traceevent.format import parse_event_format

            tracefs = Tracefs.discover()
            fork, exit_format = (
                parse_event_format(tracefs.read(f"events/sched/{name}/format"), system="sched")
                for name in ("sched_process_fork", "sched_process_exit")
            )
        except ProbescopeError as error:
            notes.append(
                f"children are not followed: the sched tracepoints cannot be read ({error.message})"
            )
            return
        for image, event in (
            (build_fork_program(fork, pid_map.fd), fork),
            (build_exit_program(exit_format, pid_map.fd), exit_format),
        ):
            fd = self.load(image, f"sched:{event.name}")
            self.attach_tracepoint(fd, event.id, f"sched:{event.name}", tracker=True)

    def release_trackers(self) -> None:
        """The target has ended: no child of it can be born any more. Detach the fork/exit
        tracker now, its grace periods overlapping whatever the session still reads."""
        fds, self.trackers = self.trackers, []
        self._close_later(fds)

    def release_probes(self) -> None:
        """The target has ended, and the session with it: detach every probe and the tracker
        now, their grace periods (~0.1 s) overlapping the last drain of the ring."""
        fds = self.links + self.perf_events + self.trackers
        self.links, self.perf_events, self.trackers = [], [], []
        self._close_later(fds)

    def _close_later(self, fds: list[int]) -> None:
        if fds:
            closing = threading.Thread(target=close_together, args=(fds,))
            closing.start()
            self.closing.append(closing)

    def detach_probes(self) -> None:
        """Close the links and perf events (the breakpoints go); programs and maps stay
        readable until `close()`."""
        close_together(self.links + self.perf_events + self.trackers)
        for closing in self.closing:
            closing.join()
        self.closing.clear()
        self.trackers.clear()
        self.links.clear()
        self.perf_events.clear()

    def close(self) -> None:
        self.detach_probes()
        for fd in reversed(self.programs):
            syscall.close(fd)
        self.programs.clear()
        for bpf_map in self.maps:
            bpf_map.close()
        if self.ring is not None:
            self.ring.close()


def close_together(fds: list[int]) -> None:
    """Close attachments concurrently: each close may wait for an RCU grace period (50 ms
    for a tracepoint's perf event here, far more per probe on the uprobe PMU), and those
    waits overlap when the closes run side by side."""
    if len(fds) <= 1:
        for fd in fds:
            syscall.close(fd)
        return
    with ThreadPoolExecutor(max_workers=min(64, len(fds))) as pool:
        list(pool.map(syscall.close, fds))


def _last_lines(log: str, count: int = 8) -> str:
    lines = [line for line in log.splitlines() if line.strip()]
    return "\n".join("  " + line for line in lines[-count:])
