"""Debian's generic 6.1 kernel and static busybox, fetched with apt-get download into a cache.

Nothing is installed on the host: packages are downloaded with `apt-get download`, unpacked with
`dpkg-deb -x` into a scratch directory, and only the files the guest needs (the kernel image, its
config and System.map, the virtio/9p modules) are kept under the user's cache directory.
"""

from __future__ import annotations

import fcntl
import gzip
import lzma
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vm.guest_errors import GuestUnavailable

# The modules that give the guest virtio-pci and a 9p root, in load order (no depmod needed).
GUEST_MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
)

# Tried after what apt-cache names, in this order; a name that left the archive just fails over.
FALLBACK_KERNEL_PACKAGES = (
    "linux-image-6.1.0-56-amd64",
    "linux-image-6.1.0-50-amd64",
    "linux-image-6.1.0-47-amd64",
)

_KERNEL_PACKAGE = re.compile(r"^linux-image-(6\.1\.0-(\d+)-amd64)$")
_MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


@dataclass(frozen=True)
class KernelImage:
    """An unpacked kernel: `release` as `uname -r` prints it, and the files the guest needs."""

    package: str
    version: str
    release: str
    vmlinuz: Path
    config: Path
    modules: tuple[Path, ...]  # uncompressed .ko files, in GUEST_MODULES order (built-ins left out)


@dataclass(frozen=True)
class Busybox:
    version: str
    path: Path


def cache_dir() -> Path:
    """$PROBESCOPE_VM_CACHE, else $XDG_CACHE_HOME/probescope/vm, else ~/.cache/probescope/vm."""
    override = os.environ.get("PROBESCOPE_VM_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "probescope" / "vm"


@contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """Serialise fetching between concurrent test sessions sharing one cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def kernel_candidates() -> Iterator[str]:
    """Package names to try, best first, without repeats: $PROBESCOPE_VM_KERNEL_PACKAGE alone,
    else what linux-image-amd64 depends on, then every 6.1 generic kernel apt lists (newest
    first), then FALLBACK_KERNEL_PACKAGES. Lazy: apt-cache search runs only if needed.
    """
    override = os.environ.get("PROBESCOPE_VM_KERNEL_PACKAGE")
    if override:
        yield override
        return
    seen: set[str] = set()
    for name in _candidate_stream():
        if name not in seen:
            seen.add(name)
            yield name


def _candidate_stream() -> Iterator[str]:
    depends = _apt_cache("depends", "linux-image-amd64")
    for match in re.finditer(r"Depends:\s*(linux-image-\S+)", depends):
        if _KERNEL_PACKAGE.match(match.group(1)):
            yield match.group(1)
    found = _apt_cache("search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$")
    listed = [line.split(" - ")[0].strip() for line in found.splitlines()]
    yield from sorted(
        (n for n in listed if _KERNEL_PACKAGE.match(n)), key=_abi_number, reverse=True
    )
    yield from FALLBACK_KERNEL_PACKAGES


def _abi_number(package: str | Path) -> int:
    """The ABI number of linux-image-6.1.0-<N>-amd64 (-1 for anything else), to find the newest."""
    match = _KERNEL_PACKAGE.match(Path(package).name)
    return int(match.group(2)) if match else -1


def fetch_kernel(cache: Path | None = None) -> KernelImage:
    """The best obtainable 6.1 generic kernel: candidates in order, each from the cache or apt.

    When no candidate can be downloaded (offline, stale apt lists even after `apt-get update`),
    the newest kernel already in the cache is used.
    """
    cache = cache or cache_dir()
    failures: list[str] = []
    with cache_lock(cache):
        for attempt in range(2):
            for name in kernel_candidates():
                image = _load_kernel(cache / name)
                if image is not None:
                    return image
                try:
                    return _download_kernel(cache, name)
                except _DownloadFailed as exc:
                    failures.append(f"{name}: {exc}")
            if attempt == 0 and not _refresh_apt_lists():
                break
        for stale in sorted(cache.glob("linux-image-6.1.0-*-amd64"), key=_abi_number, reverse=True):
            image = _load_kernel(stale)
            if image is not None:
                return image
    raise GuestUnavailable(
        "cannot obtain a Debian 6.1 generic kernel package with apt-get download:\n  "
        + "\n  ".join(list(dict.fromkeys(failures))[-6:]),
        hint="check network access to the Debian archive, or set PROBESCOPE_VM_KERNEL_PACKAGE",
    )


def fetch_busybox(cache: Path | None = None) -> Busybox:
    """Static busybox from the busybox-static package (the guest's /init shell and tools)."""
    cache = cache or cache_dir()
    with cache_lock(cache):
        for existing in sorted(cache.glob("busybox-*/busybox")):
            version = existing.parent.name.removeprefix("busybox-")
            return Busybox(version=version, path=existing)
        with tempfile.TemporaryDirectory(prefix="probescope-vm-fetch-", dir=cache) as scratch:
            try:
                deb = _apt_download("busybox-static", Path(scratch))
            except _DownloadFailed as exc:
                raise GuestUnavailable(
                    f"cannot obtain busybox-static with apt-get download: {exc}",
                    hint="check network access to the Debian archive",
                ) from None
            version = _deb_field(deb, "Version").replace(":", "_")
            root = _unpack(deb, Path(scratch) / "root")
            staged = Path(scratch) / "out"
            staged.mkdir()
            shutil.copy2(root / "bin" / "busybox", staged / "busybox")
            target = cache / f"busybox-{version}"
            _publish(staged, target)
        return Busybox(version=version, path=target / "busybox")


class _DownloadFailed(Exception):
    pass


def _apt_cache(*args: str) -> str:
    if shutil.which("apt-cache") is None:
        return ""
    done = subprocess.run(["apt-cache", *args], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""


def _refresh_apt_lists() -> bool:
    """apt-get update when we may (root); True when it ran, so candidates are worth retrying."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    done = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
    return done.returncode == 0


def _apt_download(package: str, into: Path) -> Path:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise _DownloadFailed("apt-get or dpkg-deb is not installed (not a Debian system?)")
    into.mkdir(parents=True, exist_ok=True)
    # As root, apt drops privileges to _apt for downloads; let it write here.
    into.chmod(0o777)
    done = subprocess.run(
        ["apt-get", "download", "-q", package], cwd=into, capture_output=True, text=True
    )
    debs = sorted(into.glob(f"{package}_*.deb"))
    if done.returncode != 0 or not debs:
        error = [line for line in done.stderr.splitlines() if line.startswith("E:")]
        raise _DownloadFailed(error[0] if error else done.stderr.strip() or "no .deb produced")
    return debs[0]


def _deb_field(deb: Path, field: str) -> str:
    done = subprocess.run(
        ["dpkg-deb", "--field", str(deb), field], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _unpack(deb: Path, into: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True, capture_output=True)
    return into


def _publish(staged: Path, target: Path) -> None:
    """Move a fully built directory into the cache in one rename."""
    if target.exists():
        shutil.rmtree(staged)
        return
    staged.rename(target)


def _download_kernel(cache: Path, package: str) -> KernelImage:
    with tempfile.TemporaryDirectory(prefix="probescope-vm-fetch-", dir=cache) as scratch:
        deb = _apt_download(package, Path(scratch) / "deb")
        root = _unpack(deb, Path(scratch) / "root")
        releases = sorted(p.name for p in (root / "lib" / "modules").iterdir())
        if len(releases) != 1:
            raise _DownloadFailed(f"expected one lib/modules/<release> directory, got {releases}")
        release = releases[0]
        staged = Path(scratch) / "out"
        (staged / "modules").mkdir(parents=True)
        for name in ("vmlinuz", "config", "System.map"):
            shutil.copy2(root / "boot" / f"{name}-{release}", staged / name)
        module_root = root / "lib" / "modules" / release
        builtin = _builtin_modules(module_root)
        kept: list[str] = []
        for module in GUEST_MODULES:
            source = _find_module(module_root / "kernel", module)
            if source is None:
                if module in builtin:
                    continue
                raise _DownloadFailed(f"{package} lacks module {module!r} and does not build it in")
            _decompress_module(source, staged / "modules" / f"{module}.ko")
            kept.append(module)
        (staged / "modules" / "load-order").write_text("\n".join(kept) + "\n")
        (staged / "package").write_text(f"{package}\n{_deb_field(deb, 'Version')}\n{release}\n")
        _publish(staged, cache / package)
    image = _load_kernel(cache / package)
    if image is None:
        raise _DownloadFailed(f"unpacked {package} into {cache / package} but cannot read it back")
    return image


def _load_kernel(directory: Path) -> KernelImage | None:
    try:
        package, version, release = (directory / "package").read_text().split("\n")[:3]
        order = (directory / "modules" / "load-order").read_text().split()
    except (OSError, ValueError):
        return None
    modules = tuple(directory / "modules" / f"{name}.ko" for name in order)
    files: Sequence[Path] = (directory / "vmlinuz", directory / "config", *modules)
    if not all(f.is_file() for f in files):
        return None
    return KernelImage(
        package=package,
        version=version,
        release=release,
        vmlinuz=directory / "vmlinuz",
        config=directory / "config",
        modules=modules,
    )


def _builtin_modules(module_root: Path) -> set[str]:
    try:
        lines = (module_root / "modules.builtin").read_text().split()
    except OSError:
        return set()
    return {Path(line).name.removesuffix(".ko").replace("-", "_") for line in lines}


def _find_module(kernel_tree: Path, module: str) -> Path | None:
    spellings = {module, module.replace("_", "-")}
    for path in kernel_tree.rglob(f"{module[:1]}*.ko*"):
        for suffix in _MODULE_SUFFIXES:
            if path.name.endswith(suffix) and path.name.removesuffix(suffix) in spellings:
                return path
    return None


def _decompress_module(source: Path, target: Path) -> None:
    """busybox insmod may not decompress, so modules land in the initramfs as plain .ko."""
    name = source.name
    if name.endswith(".ko"):
        shutil.copy2(source, target)
    elif name.endswith(".ko.xz"):
        target.write_bytes(lzma.decompress(source.read_bytes()))
    elif name.endswith(".ko.gz"):
        target.write_bytes(gzip.decompress(source.read_bytes()))
    elif name.endswith(".ko.zst"):
        if shutil.which("zstd") is None:
            raise _DownloadFailed(f"{name} is zstd-compressed and the zstd tool is not installed")
        subprocess.run(["zstd", "-q", "-d", "-f", str(source), "-o", str(target)], check=True)
    else:
        raise _DownloadFailed(f"unknown module compression: {name}")
