"""The guest's initramfs: static busybox, the virtio/9p modules and an /init that serves commands.

The archive is written here in cpio "newc" format rather than with the cpio tool, so the
/dev/console node can be included without root and the output is byte-for-byte reproducible.
The built image is cached per kernel package and hash of its contents.

/init mounts the host root read-only over 9p and a writable results share, then loops: it waits
for `cmd/<n>.sh` in the share (woken by a byte on /dev/ttyS1), runs it as root in
`chroot /host`, and writes `out/<n>.stdout`, `out/<n>.stderr` and, last, `out/<n>.rc`.
`cmd/stop` powers the guest off.
"""

from __future__ import annotations

import gzip
import hashlib
import stat
import tempfile
from pathlib import Path

from vm.kernel_package import Busybox, KernelImage

INIT_SCRIPT = r"""#!/bin/busybox sh
# probescope test guest: the host root over 9p, commands from the results share.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/console 2>&1

say() { echo "probescope-guest: $*"; }
die() {
    say "FATAL: $*"
    [ -d /results/out ] && echo "$*" > /results/out/fatal
    poweroff -f
}

for module in @MODULES@; do
    insmod "/lib/modules/@RELEASE@/kernel/$module.ko" || die "insmod $module failed"
done

opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$opts" results /results || die "cannot mount the results share"
mkdir -p /results/out
. /results/guest.conf || die "cannot read guest.conf"
mount -t 9p -o "$opts,ro,cache=$host_cache" host /host || die "cannot mount the host root"

mount -t proc proc /host/proc || die "mount /proc"
mount -t sysfs sysfs /host/sys || die "mount /sys"
mount -t devtmpfs devtmpfs /host/dev || die "mount /dev"
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /host/dev/pts || die "mount /dev/pts"
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm || die "mount /dev/shm"
mount -t tmpfs -o mode=1777 tmpfs /host/tmp || die "mount /tmp"
mount -t tmpfs -o mode=1777 tmpfs /host/var/tmp || die "mount /var/tmp"
mount -t tmpfs -o mode=755 tmpfs /host/run || die "mount /run"
mount -t tracefs tracefs /host/sys/kernel/tracing || die "mount tracefs"
mount -t debugfs debugfs /host/sys/kernel/debug || say "no debugfs"
mkdir -p "/host$results_path" 2>/dev/null
mount --bind /results "/host$results_path" || die "bind the results share"
for tag in $writable; do
    eval "path=\$$tag"
    mkdir -p "/host$path" 2>/dev/null
    mount -t 9p -o "$opts" "$tag" "/host$path" || die "cannot mount writable share $path"
done

# The host rings a doorbell on the second serial port after writing each command file, so the
# loop sleeps in read(2) instead of polling 9p (polling costs half a CPU under TCG). The 5 s
# read timeout only matters if a ring is lost.
stty -F /dev/ttyS1 raw -echo || die "cannot set up the doorbell port /dev/ttyS1"
exec 3<>/dev/ttyS1

cd /results
uname -r > out/ready.tmp && mv out/ready.tmp out/ready
say "ready"
n=0
while :; do
    if [ -e "cmd/$n.sh" ]; then
        say "command $n"
        env -i /bin/busybox chroot /host /bin/sh "$results_path/cmd/$n.sh" \
            <"/dev/null" >"out/$n.stdout" 2>"out/$n.stderr"
        rc=$?
        say "command $n exit $rc"
        echo "$rc" > "out/$n.rc.tmp"
        mv "out/$n.rc.tmp" "out/$n.rc"
        n=$((n + 1))
    elif [ -e cmd/stop ]; then
        say "stopping"
        sync
        poweroff -f
    else
        read -r -t 5 bell <&3
    fi
done
"""


class NewcArchive:
    """A cpio archive in the "newc" (070701) format the kernel unpacks as its initramfs."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._inode = 1

    def add_directory(self, name: str, mode: int = 0o755) -> None:
        self._add(name, stat.S_IFDIR | mode, b"", nlink=2)

    def add_file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._add(name, stat.S_IFREG | mode, data)

    def add_char_device(self, name: str, major: int, minor: int, mode: int = 0o600) -> None:
        self._add(name, stat.S_IFCHR | mode, b"", rdev=(major, minor))

    def finish(self) -> bytes:
        self._add("TRAILER!!!", 0, b"", inode=0, nlink=1)
        return b"".join(self._chunks)

    def _add(
        self,
        name: str,
        mode: int,
        data: bytes,
        *,
        nlink: int = 1,
        rdev: tuple[int, int] = (0, 0),
        inode: int | None = None,
    ) -> None:
        encoded = name.encode() + b"\0"
        if inode is None:
            inode, self._inode = self._inode, self._inode + 1
        fields = (
            inode,
            mode,
            0,
            0,
            nlink,
            0,
            len(data),
            0,
            0,
            rdev[0],
            rdev[1],
            len(encoded),
            0,
        )
        header = b"070701" + b"".join(b"%08X" % value for value in fields)
        self._chunks += [header, encoded, _padding(len(header) + len(encoded))]
        self._chunks += [data, _padding(len(data))]


def _padding(length: int) -> bytes:
    return b"\0" * (-length % 4)


def init_script(kernel: KernelImage) -> str:
    modules = " ".join(path.stem for path in kernel.modules)
    return INIT_SCRIPT.replace("@MODULES@", modules).replace("@RELEASE@", kernel.release)


def build_initramfs(kernel: KernelImage, busybox: Busybox, cache: Path) -> Path:
    """The gzip-compressed initramfs for `kernel`, built once per content and cached."""
    script = init_script(kernel)
    key = hashlib.sha256(
        "\0".join([kernel.package, kernel.version, busybox.version, script]).encode()
    ).hexdigest()[:16]
    target = cache / f"initramfs-{kernel.release}-{key}.cpio.gz"
    if target.exists():
        return target
    archive = NewcArchive()
    for directory in (
        "bin",
        "dev",
        "etc",
        "host",
        "proc",
        "results",
        "sys",
        "tmp",
        "lib",
        "lib/modules",
        f"lib/modules/{kernel.release}",
        f"lib/modules/{kernel.release}/kernel",
    ):
        archive.add_directory(directory)
    archive.add_char_device("dev/console", 5, 1)
    archive.add_file("bin/busybox", busybox.path.read_bytes(), mode=0o755)
    archive.add_file("init", script.encode(), mode=0o755)
    for module in kernel.modules:
        archive.add_file(f"lib/modules/{kernel.release}/kernel/{module.name}", module.read_bytes())
    payload = gzip.compress(archive.finish(), compresslevel=6, mtime=0)
    with tempfile.NamedTemporaryFile(dir=cache, prefix=".initramfs-", delete=False) as out:
        out.write(payload)
    Path(out.name).rename(target)
    for stale in cache.glob(f"initramfs-{kernel.release}-*.cpio.gz"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target
