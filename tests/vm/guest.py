"""A long-lived QEMU guest on Debian's 6.1 kernel that runs shell commands as root for tests.

The host kernel lacks kprobes and refuses the function tracer; this guest has both. It boots
once (about 10 s under TCG) and then serves commands over the 9p results share: the host writes
`cmd/<n>.sh`, the guest's /init runs it in `chroot /host` (the host root, read-only) and writes
the output and exit code back. The guest is killed and its scratch directory removed on close,
on timeout, on garbage collection and at interpreter exit; QEMU also dies with its parent
(PR_SET_PDEATHSIG), and scratch directories left by dead test processes are reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from vm.guest_errors import (
    GuestBootError,
    GuestError,
    GuestKernelHang,
    GuestTimeout,
    GuestUnavailable,
)
from vm.guest_pytest import GuestPytestRun, run_pytest
from vm.initramfs import build_initramfs
from vm.kernel_package import KernelImage, cache_dir, fetch_busybox, fetch_kernel

QEMU = "qemu-system-x86_64"
SCRATCH_PREFIX = "probescope-vm-"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KVM_FAILURE = re.compile(r"KVM internal error|Could not access KVM|failed to initialize kvm", re.I)
_POLL = 0.01
LOCKUP_SECONDS = 120
"""A CPU the guest's watchdog reports stuck this long: the guest kernel hung."""
_LOCKUP_CHECK_SECONDS = 5.0
_SOFT_LOCKUP = re.compile(r"BUG: soft lockup - CPU#\d+ stuck for (?P<seconds>\d+)s! \[[^\]]*\]")
# A KVM guest is ready in a few seconds; one that is not by then has hung (nested KVM does).
_KVM_BOOT_TIMEOUT = 30.0
# The serial console lags the results share a little; how long to wait for it to catch up.
_CONSOLE_SETTLE = 2.0
_UNIX_PATH_MAX = 108
PROJECT_ROOT = Path(__file__).resolve().parents[2]
GUEST_TMPFS = (Path("/tmp"), Path("/var/tmp"), Path("/run"), Path("/dev/shm"))

# How KVM fared in this process: None = not tried yet, else (accel, why KVM was not used).
_accel_choice: tuple[str, str] | None = None


@dataclass(frozen=True)
class GuestResult:
    """What one command did in the guest; `console_log` is the serial console during it."""

    command: str
    stdout: str
    stderr: str
    returncode: int
    console_log: str
    duration: float

    def check(self) -> GuestResult:
        """This result, or GuestError with the output when the command exited non-zero."""
        if self.returncode != 0:
            raise GuestError(
                f"guest command exited with {self.returncode}: {self.command!r}\n"
                f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}\nconsole:\n{self.console_log}"
            )
        return self


class GuestKernel:
    """Debian's generic 6.1 kernel in QEMU, with the host root at / and commands run as root.

    Boots on the first `run()` (or `start()`, or entering the `with` block) and stays up until
    `close()`. Paths are the same inside and outside: `shared_dir` is writable from both sides,
    `writable` host directories are shared read-write at their own path, everything else in the
    host root is read-only; /tmp, /var/tmp, /run, /dev/shm are the guest's own tmpfs.
    """

    def __init__(
        self,
        *,
        boot_timeout: float = 300.0,
        command_timeout: float = 600.0,
        memory_mb: int = 1024,
        cpus: int = 2,
        accel: str | None = None,
        writable: Sequence[Path] = (),
        host_cache: str = "loose",
        cache: Path | None = None,
    ) -> None:
        self.boot_timeout = boot_timeout
        self.command_timeout = command_timeout
        self.memory_mb = memory_mb
        self.cpus = cpus
        self.writable = tuple(Path(p) for p in writable)
        if _hidden_in_guest(PROJECT_ROOT) and PROJECT_ROOT not in self.writable:
            # A checkout under /tmp (a CI clone) would be covered by the guest's own tmpfs.
            self.writable += (PROJECT_ROOT,)
        self.host_cache = host_cache
        self._accel_request = accel or os.environ.get("PROBESCOPE_VM_ACCEL") or None
        self._cache = cache or cache_dir()
        self._kernel: KernelImage | None = None
        self._initramfs: Path | None = None
        self._boot: _Boot | None = None
        self._finalizer: weakref.finalize[[], GuestKernel] | None = None
        self.release = ""
        self.accel = ""
        self.accel_note = ""
        self.boot_seconds = 0.0
        self.boots = 0

    # -- lifecycle -------------------------------------------------------------------------

    def prepare(self) -> KernelImage:
        """Fetch the kernel and busybox and build the initramfs; GuestUnavailable if we can't."""
        if self._kernel is None:
            if shutil.which(QEMU) is None:
                raise GuestUnavailable(
                    f"{QEMU} is not installed", hint="apt-get install qemu-system-x86"
                )
            kernel = fetch_kernel(self._cache)
            busybox = fetch_busybox(self._cache)
            self._initramfs = build_initramfs(kernel, busybox, self._cache)
            self._kernel = kernel
        return self._kernel

    def start(self) -> None:
        """Boot the guest unless it is up; GuestBootError (with logs) when it does not boot."""
        if self.running:
            return
        self.kill()
        kernel = self.prepare()
        assert self._initramfs is not None
        reap_stale_scratch()
        for path in self.writable:
            path.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self._boot = self._boot_with_fallback(kernel, self._initramfs)
        self.boot_seconds = time.monotonic() - started
        self.boots += 1
        self._finalizer = weakref.finalize(self, self._boot.kill)

    def close(self) -> None:
        """Power the guest off (kill it if it does not comply) and remove its scratch files."""
        self._shut_down(graceful=True)

    def kill(self) -> None:
        """Kill QEMU at once and remove the scratch files; the next run() boots a new guest."""
        self._shut_down(graceful=False)

    def _shut_down(self, *, graceful: bool) -> None:
        boot, finalizer = self._boot, self._finalizer
        self._boot = self._finalizer = None
        if boot is None:
            return
        if graceful:
            boot.stop()
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> GuestKernel:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._boot is not None and self._boot.alive()

    @property
    def qemu_pid(self) -> int | None:
        return self._boot.process.pid if self._boot and self._boot.process else None

    @property
    def scratch(self) -> Path | None:
        """The host directory holding the share, logs and QEMU's files for this boot."""
        return self._boot.scratch if self._boot else None

    @property
    def shared_dir(self) -> Path:
        """A directory at the same path on host and guest, writable from both; gone on close."""
        self.start()
        assert self._boot is not None
        return self._boot.share / "files"

    @property
    def kernel(self) -> KernelImage:
        return self.prepare()

    # -- commands --------------------------------------------------------------------------

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | Path = "/",
        env: Mapping[str, str] | None = None,
    ) -> GuestResult:
        """Run `command` (a shell script, or an argv) as root in the guest and wait for it.

        On timeout the guest is killed (GuestTimeout); the next run boots a fresh one.
        """
        script = command if isinstance(command, str) else shlex.join(command)
        self.start()
        boot = self._boot
        assert boot is not None
        timeout = self.command_timeout if timeout is None else timeout
        variables = {
            "PATH": GUEST_PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PROBESCOPE_GUEST_KERNEL": self.release,
            **(env or {}),
        }
        header = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())
        header += f"cd {shlex.quote(str(cwd))} || exit 125\n"
        number = boot.next_command
        boot.next_command += 1
        console_start = boot.console_size()
        started = time.monotonic()
        boot.submit(number, header + script + "\n")
        try:
            returncode = boot.wait_for(number, started + timeout)
        except GuestTimeout as exc:
            stdout, stderr = boot.outputs(number)
            console = boot.console_since(console_start)
            self.kill()
            raise GuestTimeout(
                f"guest command did not finish within {timeout:g} s, guest killed: {script!r}\n"
                f"stdout so far:\n{stdout}\nstderr so far:\n{stderr}\nconsole:\n{console}"
            ) from exc
        except GuestError:
            self.kill()
            raise
        duration = time.monotonic() - started
        stdout, stderr = boot.outputs(number)
        boot.forget(number)
        return GuestResult(
            command=script,
            stdout=stdout,
            stderr=stderr,
            returncode=returncode,
            console_log=boot.console_until_marker(console_start, number),
            duration=duration,
        )

    def run_pytest(
        self,
        args: Sequence[str],
        *,
        cwd: str | Path | None = None,
        python: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        disable_plugins: Sequence[str] = ("hypothesispytest",),
    ) -> GuestPytestRun:
        """Run pytest in the guest against the project checkout; see guest_pytest.run_pytest."""
        return run_pytest(
            self,
            args,
            cwd=cwd,
            python=python,
            timeout=timeout,
            env=env,
            disable_plugins=disable_plugins,
        )

    # -- booting ---------------------------------------------------------------------------

    def _boot_with_fallback(self, kernel: KernelImage, initramfs: Path) -> _Boot:
        global _accel_choice
        if self._accel_request:
            accel, note = self._accel_request, "forced by the caller or PROBESCOPE_VM_ACCEL"
        elif _accel_choice is not None:
            accel, note = _accel_choice
        elif not os.access("/dev/kvm", os.R_OK | os.W_OK):
            accel, note = "tcg", "/dev/kvm is missing or not accessible"
        else:
            accel, note = "kvm", ""
        if accel == "kvm" and not self._accel_request:
            try:
                timeout = min(self.boot_timeout, _KVM_BOOT_TIMEOUT)
                boot = self._boot_once(kernel, initramfs, "kvm", timeout)
            except _AccelFailed as exc:
                accel, note = "tcg", f"KVM failed, fell back to TCG: {exc}"
            else:
                _accel_choice = ("kvm", "")
                self.accel, self.accel_note = "kvm", ""
                return boot
        boot = self._boot_once(kernel, initramfs, accel, self.boot_timeout)
        if not self._accel_request:
            _accel_choice = (accel, note)
        self.accel, self.accel_note = accel, note
        return boot

    def _boot_once(self, kernel: KernelImage, initramfs: Path, accel: str, timeout: float) -> _Boot:
        scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
        boot = _Boot(scratch)
        if len(os.fsencode(boot.doorbell)) >= _UNIX_PATH_MAX:
            boot.kill()
            raise GuestError(
                f"the guest's doorbell socket path is too long for AF_UNIX: {boot.doorbell}",
                hint="point TMPDIR at a shorter directory",
            )
        try:
            boot.write_config(self.host_cache, self.writable)
            argv = self._qemu_argv(kernel, initramfs, accel, boot)
            boot.launch(argv)
            self.release = boot.wait_ready(time.monotonic() + timeout, accel)
        except BaseException:
            boot.kill()
            raise
        return boot

    def _qemu_argv(
        self, kernel: KernelImage, initramfs: Path, accel: str, boot: _Boot
    ) -> list[str]:
        argv = [
            QEMU,
            "-accel",
            accel,
            "-m",
            str(self.memory_mb),
            "-smp",
            str(self.cpus),
            "-nographic",
            "-nodefaults",
            "-no-user-config",
            "-no-reboot",
            "-monitor",
            "none",
            "-serial",
            f"file:{boot.console}",
            "-chardev",
            f"socket,id=doorbell,path={boot.doorbell},server=on,wait=off",
            "-serial",
            "chardev:doorbell",
            "-kernel",
            str(kernel.vmlinuz),
            "-initrd",
            str(initramfs),
            "-append",
            "console=ttyS0 panic=-1 loglevel=5",
            "-virtfs",
            _virtfs(Path("/"), "host", readonly=True),
            "-virtfs",
            _virtfs(boot.share, "results"),
        ]
        if accel == "kvm":
            argv += ["-cpu", "host"]
        for index, path in enumerate(self.writable):
            argv += ["-virtfs", _virtfs(path, f"rw{index}")]
        return argv


def _virtfs(path: Path, tag: str, *, readonly: bool = False) -> str:
    escaped = str(path).replace(",", ",,")
    spec = f"local,path={escaped},mount_tag={tag},security_model=none,multidevs=remap"
    return spec + (",readonly=on" if readonly else "")


class _AccelFailed(GuestBootError):
    pass


class _Boot:
    """One QEMU process and its scratch directory: share/ (9p), console.log, qemu.log."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.share = scratch / "share"
        self.console = scratch / "console.log"
        self.qemu_log = scratch / "qemu.log"
        self.doorbell = scratch / "doorbell.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self._bell: socket.socket | None = None
        self.next_command = 0
        for directory in (self.share / "cmd", self.share / "out", self.share / "files"):
            directory.mkdir(parents=True)

    def write_config(self, host_cache: str, writable: Sequence[Path]) -> None:
        tags = [f"rw{i}" for i in range(len(writable))]
        lines = [
            f"results_path={shlex.quote(str(self.share))}",
            f"host_cache={shlex.quote(host_cache)}",
            f"writable={shlex.quote(' '.join(tags))}",
            *(f"{tag}={shlex.quote(str(path))}" for tag, path in zip(tags, writable, strict=True)),
        ]
        (self.share / "guest.conf").write_text("\n".join(lines) + "\n")

    def launch(self, argv: list[str]) -> None:
        with open(self.qemu_log, "wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, deadline: float, accel: str) -> str:
        """The guest's `uname -r` once /init says ready; any failure under KVM is _AccelFailed."""
        ready = self.share / "out" / "ready"
        while True:
            if ready.exists():
                release = ready.read_text().strip()
                if release:
                    return release
            failure = self._failure()
            if not failure and accel == "kvm" and _KVM_FAILURE.search(self._read(self.qemu_log)):
                failure = "QEMU reported a KVM error"
            if not failure and time.monotonic() > deadline:
                failure = "the guest did not become ready within the boot timeout"
            if failure:
                message = f"the guest did not boot ({accel}): {failure}"
                if accel == "kvm":
                    raise _AccelFailed(f"{failure}: {_first_line(self._read(self.qemu_log))}")
                raise GuestBootError(self._report(message))
            time.sleep(_POLL)

    def submit(self, number: int, script: str) -> None:
        staged = self.share / "cmd" / f".{number}.sh"
        staged.write_text(script)
        staged.rename(self.share / "cmd" / f"{number}.sh")
        self.ring()

    def ring(self) -> None:
        """Wake /init (it reads /dev/ttyS1); if this fails, it still looks within 5 s."""
        try:
            if self._bell is None:
                bell = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                bell.connect(str(self.doorbell))
                self._bell = bell
            self._bell.sendall(b"\n")
        except OSError:
            self._close_bell()

    def _close_bell(self) -> None:
        if self._bell is not None:
            self._bell.close()
            self._bell = None

    def wait_for(self, number: int, deadline: float) -> int:
        rc = self.share / "out" / f"{number}.rc"
        looked = time.monotonic()
        while True:
            if rc.exists():
                return int(rc.read_text())
            failure = self._failure()
            if failure:
                raise GuestError(self._report(f"the guest died during command {number}: {failure}"))
            if time.monotonic() > deadline:
                raise GuestTimeout(f"command {number} timed out")
            if time.monotonic() - looked > _LOCKUP_CHECK_SECONDS:
                looked = time.monotonic()
                stuck = self.lockup()
                if stuck:
                    raise GuestKernelHang(
                        self._report(f"the guest kernel locked up during command {number}: {stuck}")
                    )
            time.sleep(_POLL)

    def lockup(self) -> str:
        """The kernel watchdog's report of a CPU stuck for longer than LOCKUP_SECONDS ("" if
        none): a soft lockup that long under TCG is a hang (a lost IPI: the kernel waits on a
        CPU that never answers), not slowness."""
        for match in _SOFT_LOCKUP.finditer(self._read(self.console)):
            if int(match["seconds"]) >= LOCKUP_SECONDS:
                return match[0]
        return ""

    def outputs(self, number: int) -> tuple[str, str]:
        out = self.share / "out"
        return self._read(out / f"{number}.stdout"), self._read(out / f"{number}.stderr")

    def forget(self, number: int) -> None:
        for path in (
            self.share / "cmd" / f"{number}.sh",
            *(self.share / "out" / f"{number}.{kind}" for kind in ("stdout", "stderr", "rc")),
        ):
            path.unlink(missing_ok=True)

    def console_size(self) -> int:
        try:
            return self.console.stat().st_size
        except OSError:
            return 0

    def console_since(self, offset: int) -> str:
        try:
            with open(self.console, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace").replace("\r\n", "\n")
        except OSError:
            return ""

    def console_until_marker(self, offset: int, number: int) -> str:
        """The console since `offset`, once /init's end-of-command line has come through."""
        marker = f"probescope-guest: command {number} exit "
        deadline = time.monotonic() + _CONSOLE_SETTLE
        while True:
            text = self.console_since(offset)
            if marker in text or time.monotonic() > deadline:
                return text
            time.sleep(_POLL)

    def stop(self) -> None:
        """Ask /init to power off; it has a few seconds before kill() does it by force."""
        if not self.alive():
            return
        with contextlib.suppress(OSError):
            (self.share / "cmd" / "stop").touch()
        self.ring()
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    def kill(self) -> None:
        """Kill QEMU's whole process group and remove the scratch directory. Idempotent."""
        self._close_bell()
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _failure(self) -> str:
        fatal = self.share / "out" / "fatal"
        if fatal.exists():
            return f"/init reported: {self._read(fatal).strip()}"
        if self.process is not None and self.process.poll() is not None:
            return f"QEMU exited with status {self.process.returncode}"
        return ""

    def _report(self, message: str) -> str:
        console = self._read(self.console)[-6000:]
        qemu = self._read(self.qemu_log)[-3000:]
        return f"{message}\n--- QEMU output ---\n{qemu}\n--- console (tail) ---\n{console}"

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_bytes().decode(errors="replace")
        except OSError:
            return ""


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process dies, however it dies."""
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def reap_stale_scratch() -> list[Path]:
    """Remove scratch directories of test processes that no longer exist; return them."""
    removed: list[Path] = []
    pattern = re.compile(rf"^{re.escape(SCRATCH_PREFIX)}(\d+)-")
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        match = pattern.match(path.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def qemu_processes(scratch: Path) -> list[int]:
    """Pids of processes whose command line mentions `scratch` (our QEMU, if still alive)."""
    found = []
    needle = str(scratch).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(proc.name))
    return found


def _hidden_in_guest(path: Path) -> bool:
    return any(path == hidden or hidden in path.parents for hidden in GUEST_TMPFS)
