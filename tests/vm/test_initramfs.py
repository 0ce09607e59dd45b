"""The initramfs writer, checked with GNU cpio, and the JUnit reader, checked with real pytest."""

from __future__ import annotations

import gzip
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vm.guest_pytest import parse_junit
from vm.initramfs import INIT_SCRIPT, NewcArchive, build_initramfs, init_script
from vm.kernel_package import GUEST_MODULES, Busybox, KernelImage

needs_cpio = pytest.mark.skipif(shutil.which("cpio") is None, reason="GNU cpio is not installed")


def _archive() -> bytes:
    archive = NewcArchive()
    archive.add_directory("bin")
    archive.add_directory("dev")
    archive.add_char_device("dev/console", 5, 1)
    archive.add_file("bin/tool", b"\x7fELF" + bytes(range(256)) * 3, mode=0o755)
    archive.add_file("init", b"#!/bin/sh\necho odd-length\n", mode=0o755)
    archive.add_file("empty", b"")
    return archive.finish()


def test_newc_entries_are_4_byte_aligned_and_end_with_the_trailer() -> None:
    data = _archive()
    assert data.startswith(b"070701")
    assert len(data) % 4 == 0
    assert data.rstrip(b"\0").endswith(b"TRAILER!!!")


@needs_cpio
def test_gnu_cpio_lists_modes_and_device_numbers() -> None:
    listing = subprocess.run(
        ["cpio", "-itv", "--quiet"], input=_archive(), capture_output=True, check=True
    ).stdout.decode()
    rows = [line.split() for line in listing.splitlines()]
    by_name = {row[-1]: row for row in rows}
    assert list(by_name) == ["bin", "dev", "dev/console", "bin/tool", "init", "empty"]
    assert by_name["bin"][0] == "drwxr-xr-x"
    assert by_name["dev/console"][0] == "crw-------"
    assert by_name["dev/console"][4:6] == ["5,", "1"]
    assert by_name["bin/tool"][0] == "-rwxr-xr-x"
    assert by_name["bin/tool"][4] == str(4 + 256 * 3)


@needs_cpio
def test_gnu_cpio_extracts_identical_contents(tmp_path: Path) -> None:
    subprocess.run(
        ["cpio", "-idm", "--quiet", "--no-absolute-filenames"],
        input=_archive(),
        cwd=tmp_path,
        check=True,
    )
    assert (tmp_path / "bin" / "tool").read_bytes() == b"\x7fELF" + bytes(range(256)) * 3
    assert (tmp_path / "init").read_text() == "#!/bin/sh\necho odd-length\n"
    assert stat.S_IMODE((tmp_path / "init").stat().st_mode) == 0o755
    assert (tmp_path / "empty").read_bytes() == b""


def _fake_kernel(tmp_path: Path) -> tuple[KernelImage, Busybox]:
    modules = []
    for name in GUEST_MODULES:
        module = tmp_path / f"{name}.ko"
        module.write_bytes(name.encode())
        modules.append(module)
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"busybox bytes")
    kernel = KernelImage(
        package="linux-image-6.1.0-99-amd64",
        version="6.1.999-1",
        release="6.1.0-99-amd64",
        vmlinuz=tmp_path / "vmlinuz",
        config=tmp_path / "config",
        modules=tuple(modules),
    )
    return kernel, Busybox(version="1.0", path=busybox)


def test_init_script_loads_the_modules_in_order() -> None:
    assert "@MODULES@" in INIT_SCRIPT
    kernel = KernelImage(
        "p",
        "v",
        "6.1.0-1-amd64",
        Path("k"),
        Path("c"),
        tuple(Path(f"/x/{m}.ko") for m in GUEST_MODULES),
    )
    script = init_script(kernel)
    assert f"for module in {' '.join(GUEST_MODULES)}; do" in script
    assert '"/lib/modules/6.1.0-1-amd64/kernel/$module.ko"' in script


@needs_cpio
def test_initramfs_is_cached_by_content_and_holds_init_busybox_modules(tmp_path: Path) -> None:
    kernel, busybox = _fake_kernel(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    first = build_initramfs(kernel, busybox, cache)
    assert build_initramfs(kernel, busybox, cache) == first
    listing = (
        subprocess.run(
            ["cpio", "-it", "--quiet"],
            input=gzip.decompress(first.read_bytes()),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split()
    )
    assert {"init", "bin/busybox", "dev/console"} <= set(listing)
    assert "lib/modules/6.1.0-99-amd64/kernel/9pnet_virtio.ko" in listing
    other = build_initramfs(kernel, Busybox(version="2.0", path=busybox.path), cache)
    assert other != first


def test_parse_junit_reads_what_pytest_writes(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_ok():
                pass

            def test_bad():
                assert False, "boom"

            @pytest.mark.skip(reason="not today")
            def test_later():
                pass

            @pytest.fixture
            def broken():
                raise RuntimeError("fixture broke")

            def test_broken(broken):
                pass
            """
        )
    )
    report = tmp_path / "junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "-o",
            "junit_family=xunit2",
            "test_sample.py",
        ],
        cwd=tmp_path,
        capture_output=True,
    )
    cases = parse_junit(report.read_text())
    assert [(c.nodeid, c.outcome) for c in cases] == [
        ("test_sample::test_ok", "passed"),
        ("test_sample::test_bad", "failed"),
        ("test_sample::test_later", "skipped"),
        ("test_sample::test_broken", "error"),
    ]
    assert "boom" in cases[1].message
    assert cases[2].message == "not today"
