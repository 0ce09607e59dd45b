"""The fentry tracer: sets processes up, then serves them from a background thread.

Nothing here runs per hit. `spawn()` (a command, held at its exec stop) and `attach()` (a
running process) do one transaction each on the caller's thread: stop every thread, clean up
what a killed earlier run left, inject the ring, the thread state and the code areas, patch,
detach. The service thread then:
- answers handshakes: at a dlopen it stops the process, patches the new libraries and
  acknowledges; at an exec it follows the calling thread through the exec (PTRACE_SYSCALL
  until the exec event, or until execve fails) and sets the new image up at its exec stop;
- watches the processes: exits (the command's status), fork children (they keep their parent's
  patched copy and write into the same ring; noticed from their records or /proc), and execs
  that bypassed libc's wrappers (the areas vanished: set up again late, with a note);
- on detach, restores every process (restore.py) and stops serving.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from probescope.engines.fentry import execs, safety
from probescope.engines.fentry import restore as restoring
from probescope.engines.fentry.area import F_DLOPEN, F_EXEC, MAGIC, Owner
from probescope.engines.fentry.catalog import Catalog
from probescope.engines.fentry.image import Family, Image, Installer
from probescope.engines.fentry.inject import owner_of_this_process, process_start_time
from probescope.engines.fentry.ring import Request
from probescope.engines.fentry.world import EXEC_OPTIONS, ProcessGone, StoppedProcess
from probescope.engines.ptrace import spawn, syscalls
from probescope.errors import ProbescopeError, PtraceError
from probescope.system import procfs
from probescope.system.maps import read_maps

_RETRIES = 50
_CHECK_INTERVAL = 0.05
_ESRCH = 3
_sessions = itertools.count(1)
ACTIVE_SESSIONS: set[int] = set()  # this process's live tracers (their areas are not leftovers)


@dataclass
class TracerOptions:
    ring_records: int = 1 << 17
    follow_children: bool = True


@dataclass
class TracerCounters:
    transactions: int = 0
    dlopen_handshakes: int = 0
    exec_handshakes: int = 0
    late_execs: int = 0
    forks: int = 0
    retries: int = 0
    restored_sites: int = 0
    restored_returns: int = 0
    notes: list[str] = field(default_factory=list)


class FentryTracer:
    def __init__(self, catalog: Catalog, options: TracerOptions) -> None:
        self.catalog = catalog
        self.options = options
        self.session = next(_sessions)
        ACTIVE_SESSIONS.add(self.session)
        self.owner: Owner = owner_of_this_process(self.session)
        self.counters = TracerCounters()
        self.notes = self.counters.notes
        self.installer = Installer(catalog, self.owner, options.ring_records, self.notes)
        self.images: dict[int, Image] = {}
        self.families: list[Family] = []
        self.unfollowed: set[int] = set()
        self.lock = threading.RLock()
        self.root_pid: int | None = None
        self.root_status: int | None = None
        self.spawned = False
        self.stop_requested = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self._seen_pids: set[int] = set()
        self._thread: threading.Thread | None = None
        self.detached = False
        # called with the pid after each install, while the process is stopped (the reader
        # keeps its comm and memory map, which a short-lived process no longer has later)
        self.on_installed: list[Callable[[int], None]] = []

    # =========================================================================================
    # Getting hold of processes (caller's thread)

    def spawn(self, argv: Sequence[str], on_spawn: Callable[[int], None] | None = None) -> int:
        child = spawn.fork_held(argv)
        try:
            syscalls.seize(child.pid, syscalls.PTRACE_O_TRACEEXEC)
            if on_spawn is not None:
                on_spawn(child.pid)
        except BaseException:
            os.kill(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)
            child.close()
            raise
        child.release()
        while True:
            _, status = os.waitpid(child.pid, syscalls.WALL)
            if not syscalls.stopped(status):
                error = child.exec_error()
                raise PtraceError(
                    f"cannot start {argv[0]!r}: {error or syscalls.describe_status(status)}"
                )
            if syscalls.stop_event(status) == syscalls.PTRACE_EVENT_EXEC:
                break
            sig = syscalls.stop_signal(status)
            syscalls.cont(child.pid, 0 if sig == signal.SIGTRAP else sig)
        child.exec_error()
        self.root_pid = child.pid
        self.spawned = True
        image = Image(child.pid)
        self._install(child.pid, image, seized={child.pid: status})
        return child.pid

    def attach(self, pid: int) -> None:
        if not os.path.exists(f"/proc/{pid}"):
            raise PtraceError(f"no process with pid {pid}")
        tracer = procfs.tracer_of(pid)
        if tracer:
            raise PtraceError(
                f"process {pid} is already traced by process {tracer}",
                hint="a process can have one tracer: detach gdb/strace/ltrace first",
            )
        if (procfs.thread_group(pid) or pid) != pid:
            raise PtraceError(f"{pid} is a thread of process {procfs.thread_group(pid)}")
        problem = safety.process_problem(pid)
        if problem is not None:
            raise PtraceError(f"process {pid}: {problem}", hint="use --engine ptrace or tracefs")
        if self.root_pid is None:
            self.root_pid = pid
        self._install(pid, Image(pid), clean=True)

    # =========================================================================================
    # Installing (any thread, one transaction at a time)

    def _install(
        self,
        pid: int,
        image: Image,
        *,
        seized: dict[int, int] | None = None,
        clean: bool = False,
        before_release: Callable[[StoppedProcess], None] | None = None,
    ) -> None:
        blocked: list[int] = []
        for attempt in range(_RETRIES):
            world = StoppedProcess(pid).stop(seized if attempt == 0 else None)
            self.counters.transactions += 1
            try:
                if attempt == 0:
                    if clean:
                        self._clean_leftovers(world)
                    if image.return_refusal is None:
                        # glibc turns the shadow stack on during start-up: checked again at
                        # every transaction, and hooks already placed are taken back
                        image.return_refusal = safety.return_problem(world)
                        if image.return_refusal is not None:
                            self.notes.append(image.return_refusal)
                            self.installer.drop_return_hooks(world, image)
                blocked = self.installer.install(world, image)
                if image.family is not None:
                    with self.lock:
                        if image.family not in self.families:
                            self.families.append(image.family)
                        image.family.pids.add(pid)
                        self.images[pid] = image
                for callback in self.on_installed:
                    callback(pid)
                if before_release is not None and not blocked:
                    before_release(world)
            finally:
                world.release()
            if not blocked:
                return
            self.counters.retries += 1
            time.sleep(0.001)
        if before_release is not None:
            with StoppedProcess(pid).stop() as world:
                before_release(world)
        self.notes.append(
            f"process {pid}: {len(blocked)} sites not patched (a thread kept running inside "
            "their first bytes)"
        )

    def _clean_leftovers(self, world: StoppedProcess) -> None:
        """Restore what a dead earlier probescope left; refuse a process a live one serves."""
        for area in restoring.find_areas(world):
            if _live_owner(area.header, self.owner):
                raise PtraceError(
                    f"process {world.pid} is traced by another probescope session "
                    f"(pid {area.header['owner_pid']})",
                    hint=f"stop that session first, or `probescope cleanup -p {world.pid}` "
                    "once it is gone",
                )
        report = restoring.restore(
            world,
            self.installer.injector,
            lambda header: (
                not _live_owner(header, self.owner) and not _owned_by(header, self.owner)
            ),
        )
        if report.sites or report.returns:
            self.notes.append(
                f"process {world.pid}: restored {report.sites} sites and {report.returns} "
                "return addresses left by a probescope that was killed"
            )

    # =========================================================================================
    # The service thread

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="probescope-fentry", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # reported by the engine's events()
            self.error = error
            try:
                self._detach_all()
            except BaseException:
                pass
        finally:
            self.finished.set()

    def _serve(self) -> None:
        last_check = 0.0
        while not self.stop_requested.is_set():
            served = self._serve_requests()
            now = time.monotonic()
            if now - last_check >= _CHECK_INTERVAL:
                last_check = now
                self._check_processes()
                if self._all_gone():
                    break
            if not served:
                time.sleep(0.001)
        self._detach_all()

    def saw_pid(self, pid: int) -> None:
        """A record came from `pid` (called by the reader)."""
        self._seen_pids.add(pid)

    # -- handshakes --------------------------------------------------------------------------

    def _serve_requests(self) -> bool:
        served = False
        with self.lock:
            families = list(self.families)
        for family in families:
            request = family.ring.pending_request()
            if request is None:
                continue
            served = True
            if not os.path.exists(f"/proc/{request.tid}"):
                family.ring.break_lock(request.tid)
                family.ring.acknowledge(request)
                continue
            try:
                if request.kind & F_EXEC:
                    self.counters.exec_handshakes += 1
                    self._follow_exec(family, request)
                elif request.kind & F_DLOPEN:
                    self.counters.dlopen_handshakes += 1
                    self._serve_dlopen(family, request)
                else:
                    family.ring.acknowledge(request)
            except ProcessGone:
                family.ring.acknowledge(request)
        return served

    def _image_for(self, pid: int, family: Family) -> Image:
        """The image of `pid`; a fork child we had not seen gets a copy of its family's."""
        with self.lock:
            image = self.images.get(pid)
            if image is not None:
                return image
            parent = next((self.images[p] for p in family.pids if p in self.images), None)
            image = parent.fork_copy(pid) if parent is not None else Image(pid, family)
            self.images[pid] = image
            family.pids.add(pid)
            self.counters.forks += 1
            return image

    def _serve_dlopen(self, family: Family, request: Request) -> None:
        image = self._image_for(request.pid, family)
        self._install(
            request.pid, image, before_release=lambda world: family.ring.acknowledge(request)
        )

    def _follow_exec(self, family: Family, request: Request) -> None:
        """Stop the process, let the thread that asked go on into its exec (execs.py), and set
        the new image up at its exec stop (or let everything go if execve fails)."""
        world = StoppedProcess(request.pid, EXEC_OPTIONS).stop()
        self.counters.transactions += 1
        family.ring.acknowledge(request)
        outcome = execs.follow(world, request.tid)
        if outcome is None:
            self.notes.append(f"process {world.pid}: an announced exec did not happen in time")
        elif outcome is not False:
            self._exec_happened(world, outcome)

    def _exec_happened(self, world: StoppedProcess, status: int) -> None:
        """The process completed an exec: set its new image up while its only thread is still
        held at the exec stop (it reports with tid == tgid), before any of it runs."""
        pid = world.pid
        with self.lock:
            old = self.images.pop(pid, None)
            if old is not None and old.family is not None:
                old.family.pids.discard(pid)
        if pid in self.unfollowed or (not self.options.follow_children and pid != self.root_pid):
            world.release()
            return
        # hand the held thread over to a new transaction (the old one held the old mm)
        world.threads = {}
        world.release()
        self._install(pid, Image(pid), seized={pid: status})

    # -- processes ---------------------------------------------------------------------------

    def _check_processes(self) -> None:
        if self.spawned and self.root_pid is not None and self.root_status is None:
            try:
                got, status = os.waitpid(self.root_pid, os.WNOHANG)
            except ChildProcessError:
                got, status = self.root_pid, 0
            if got:
                self.root_status = status
        with self.lock:
            known = dict(self.images)
        for pid, image in known.items():
            if not _alive(pid):
                with self.lock:
                    self.images.pop(pid, None)
                continue
            if image.areas and not _has_magic(pid, image.areas[0].start):
                # the areas are gone while the process lives: an exec libc did not announce
                with self.lock:
                    self.images.pop(pid, None)
                self.counters.late_execs += 1
                self.notes.append(
                    f"process {pid} exec'd without libc's execve: probes armed late there"
                )
                try:
                    self._install(pid, Image(pid))
                except (ProcessGone, PtraceError):
                    pass
        self._adopt_children(known)

    def _adopt_children(self, known: dict[int, Image]) -> None:
        candidates = set(self._seen_pids)
        self._seen_pids.clear()
        for pid in known:
            candidates |= _children(pid)
        for pid in candidates:
            if pid in known or pid in self.unfollowed or not _alive(pid):
                continue
            family = self._family_of(pid)
            if family is None:
                continue
            if not self.options.follow_children:
                self.unfollowed.add(pid)
                self._release_child(pid)
                continue
            self._image_for(pid, family)

    def _family_of(self, pid: int) -> Family | None:
        try:
            maps = read_maps(pid)
        except (OSError, ProbescopeError):
            return None
        with self.lock:
            for family in self.families:
                if any(m.path and family.ring.name in m.path for m in maps):
                    return family
        return None

    def _release_child(self, pid: int) -> None:
        try:
            with StoppedProcess(pid).stop() as world:
                restoring.restore(
                    world, self.installer.injector, lambda header: _owned_by(header, self.owner)
                )
        except (ProcessGone, PtraceError):
            pass

    def _all_gone(self) -> bool:
        if self.spawned and self.root_status is None:
            return False
        with self.lock:
            return not any(_alive(pid) for pid in self.images)

    # =========================================================================================
    # Detach

    def _restore_process(self, pid: int) -> None:
        """Restore one process — our areas and what a killed session left that could not be
        unmapped at attach; while a thread runs inside a stub, let it out and try again (sites
        and return addresses are restored at the first try; only the unmapping waits)."""
        for attempt in range(_RETRIES):
            try:
                with StoppedProcess(pid).stop() as world:
                    self.counters.transactions += 1
                    report = restoring.restore(
                        world, self.installer.injector, lambda h: not _live_owner(h, self.owner)
                    )
            except (ProcessGone, PtraceError) as error:
                if _alive(pid):
                    self.notes.append(f"process {pid}: not restored: {error}")
                return
            self.counters.restored_sites += report.sites
            self.counters.restored_returns += report.returns
            self.notes.extend(report.notes)
            if report.kept_because is None:
                return
            if "running code" not in report.kept_because or attempt == _RETRIES - 1:
                self.notes.append(_restore_kept_note(pid, report.kept_because))
                return
            time.sleep(0.001)

    def detach(self, timeout: float = 30.0) -> None:
        """Restore every process and stop the service thread."""
        self.stop_requested.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        elif thread is None and not self.detached:
            self._detach_all()

    def _detach_all(self) -> None:
        if self.detached:
            return
        self.detached = True
        ACTIVE_SESSIONS.discard(self.session)
        with self.lock:
            pids = set(self.images)
            families = list(self.families)
        pids |= _processes_mapping([f.ring.name for f in families])
        for family in families:
            family.ring.stop_serving()
        for pid in sorted(pids):
            if _alive(pid):
                self._restore_process(pid)
        if self.spawned and self.root_pid is not None and self.root_status is None:
            try:
                got, status = os.waitpid(self.root_pid, os.WNOHANG)
                if got:
                    self.root_status = status
            except ChildProcessError:
                pass


def _restore_kept_note(pid: int, reason: str) -> str:
    return f"process {pid}: code areas left mapped: {reason}"


def _owned_by(header: dict[str, int], owner: Owner) -> bool:
    return (
        header["owner_pid"] == owner.pid
        and header["start_time"] == owner.start_time
        and header["session"] == owner.session
    )


def _live_owner(header: dict[str, int], me: Owner) -> bool:
    """Whether the areas' session still runs (another process, or another session of ours)."""
    if _owned_by(header, me):
        return False
    pid, start = header["owner_pid"], header["start_time"]
    if pid == me.pid and start == me.start_time:
        return header["session"] in ACTIVE_SESSIONS
    return bool(pid) and process_start_time(pid) == start


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    state = data[data.rfind(b")") + 2 : data.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def _has_magic(pid: int, address: int) -> bool:
    """Whether our area is still at `address` (False only when the process lives on without
    it: an exiting process, whose memory is already gone, does not count)."""
    reader = syscalls.RemoteReader(64)
    if reader.read(pid, address, len(MAGIC)) == MAGIC:
        return True
    try:
        maps = read_maps(pid)
    except (OSError, ProbescopeError):
        return True
    if not maps or not _alive(pid):
        return True  # exiting
    return reader.read(pid, address, len(MAGIC)) == MAGIC


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for tid in procfs.thread_ids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(x) for x in f.read().split())
        except OSError:
            continue
    return found


def _processes_mapping(names: list[str]) -> set[int]:
    """Every process that maps one of our rings (fork children we may never have seen)."""
    if not names:
        return set()
    found = set()
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == me:
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                text = f.read()
        except OSError:
            continue
        if any(name in text for name in names):
            found.add(int(entry))
    return found
