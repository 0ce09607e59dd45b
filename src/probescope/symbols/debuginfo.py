"""Finding the symbols a stripped binary lost: build-id debug files, .gnu_debuglink, MiniDebugInfo.

The search order follows bcc's `find_debug_file` and gdb: a debug file named by the build-id
under each debug directory (and in debuginfod's client cache), then the file `.gnu_debuglink`
names — in the binary's directory, its `.debug/` subdirectory and `<debugdir>/<dir>/`, accepted
only when its CRC32 matches — then the xz-compressed ELF in `.gnu_debugdata` (MiniDebugInfo,
Fedora's function symbols missing from `.dynsym`). Debug files keep the original link-time
addresses, so their symbols are turned into file offsets with the PT_LOADs of the binary itself.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from probescope.errors import SymbolError

if TYPE_CHECKING:
    from probescope.symbols.elfimage import ElfImage

DEBUG_DIRS_ENV = "PROBESCOPE_DEBUG_DIRS"
DEFAULT_DEBUG_DIRS = ("/usr/lib/debug",)


class DebugSymbols(NamedTuple):
    """Where a stripped binary's symbols were found: `kind` is build-id/debuglink/minidebuginfo."""

    kind: str
    path: str | None
    image: ElfImage


class DebugSearch(NamedTuple):
    """The result of a search, and every candidate path looked at (found or not).

    `checked` lets a cached table notice a debug file installed (or removed) later.
    `rejected` explains candidates that exist but were refused (CRC or build-id mismatch).
    """

    found: DebugSymbols | None
    checked: tuple[str, ...]
    rejected: tuple[str, ...]


def default_debug_dirs() -> tuple[str, ...]:
    """`$PROBESCOPE_DEBUG_DIRS` (colon-separated) or `/usr/lib/debug`."""
    value = os.environ.get(DEBUG_DIRS_ENV)
    if value:
        return tuple(d for d in value.split(os.pathsep) if d)
    return DEFAULT_DEBUG_DIRS


def debuginfod_cache_dir() -> str:
    """debuginfod's client cache (`$DEBUGINFOD_CACHE_PATH`, else under the XDG cache home)."""
    explicit = os.environ.get("DEBUGINFOD_CACHE_PATH")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "debuginfod_client")


def _container_root(path: str) -> str | None:
    """`/proc/PID/root` when `path` reaches a file through a process's root directory."""
    parts = path.split("/")
    if len(parts) > 4 and parts[1] == "proc" and parts[2].isdigit() and parts[3] == "root":
        return "/".join(parts[:4])
    return None


def _search_dirs(path: str, debug_dirs: Sequence[str]) -> list[str]:
    dirs = list(debug_dirs)
    root = _container_root(path)
    if root is not None:
        dirs = [root + "/usr/lib/debug", *dirs]
    return dirs


def find_debug_symbols(
    image: ElfImage, path: str, debug_dirs: Sequence[str] | None = None
) -> DebugSearch:
    """Look for the symbols of the stripped binary `image` (opened from `path`)."""
    dirs = _search_dirs(path, default_debug_dirs() if debug_dirs is None else debug_dirs)
    checked: list[str] = []
    rejected: list[str] = []
    build_id = image.build_id
    if build_id and len(build_id) > 2:
        candidates = [f"{d}/.build-id/{build_id[:2]}/{build_id[2:]}.debug" for d in dirs]
        candidates.append(os.path.join(debuginfod_cache_dir(), build_id, "debuginfo"))
        for candidate in candidates:
            checked.append(candidate)
            debug = _open_debug_file(candidate, image, rejected)
            if debug is None:
                continue
            if debug.build_id != build_id:
                rejected.append(f"{candidate}: build-id {debug.build_id} differs")
                debug.close()
                continue
            return DebugSearch(DebugSymbols("build-id", candidate, debug), tuple(checked), ())
    link = image.debuglink
    if link is not None:
        name, crc = link
        for candidate in _debuglink_candidates(path, name, dirs):
            checked.append(candidate)
            if _same_file(candidate, path):
                continue
            debug = _open_debug_file(candidate, image, rejected)
            if debug is None:
                continue
            actual = _file_crc32(candidate)
            if actual != crc:
                rejected.append(
                    f"{candidate}: CRC32 {actual:#010x} differs from .gnu_debuglink's {crc:#010x}"
                )
                debug.close()
                continue
            return DebugSearch(DebugSymbols("debuglink", candidate, debug), tuple(checked), ())
    mini = _minidebuginfo(image)
    if mini is not None:
        return DebugSearch(DebugSymbols("minidebuginfo", None, mini), tuple(checked), ())
    return DebugSearch(None, tuple(checked), tuple(rejected))


def _debuglink_candidates(path: str, name: str, dirs: Sequence[str]) -> list[str]:
    directories = [os.path.dirname(os.path.abspath(path))]
    real = os.path.dirname(os.path.realpath(path))
    if real not in directories:
        directories.append(real)
    candidates: list[str] = []
    for directory in directories:
        candidates += [f"{directory}/{name}", f"{directory}/.debug/{name}"]
    for debug_dir in dirs:
        for directory in directories:
            candidates.append(f"{debug_dir}{directory}/{name}")
    return list(dict.fromkeys(candidates))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _open_debug_file(candidate: str, image: ElfImage, rejected: list[str]) -> ElfImage | None:
    from probescope.symbols.elfimage import ElfImage, is_elf

    if not os.path.isfile(candidate) or not is_elf(candidate):
        return None
    try:
        debug = ElfImage.from_path(candidate)
    except SymbolError as error:
        rejected.append(f"{candidate}: {error.message}")
        return None
    if debug.machine != image.machine or debug.elf_class != image.elf_class:
        rejected.append(f"{candidate}: {debug.machine_name} file for a {image.machine_name} binary")
    elif debug.symtab is None:
        rejected.append(f"{candidate}: has no .symtab")
    else:
        return debug
    debug.close()
    return None


def _file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _minidebuginfo(image: ElfImage) -> ElfImage | None:
    section = image.section(".gnu_debugdata")
    if section is None:
        return None
    import lzma

    from probescope.symbols.elfimage import ElfImage

    try:
        data = lzma.decompress(image.section_data(section))
    except lzma.LZMAError as error:
        raise SymbolError(
            f"{image.name}: cannot decompress .gnu_debugdata (MiniDebugInfo): {error}",
            hint="the section should hold an xz-compressed ELF file",
        ) from None
    mini = ElfImage.from_bytes(data, name=f"{image.name}[.gnu_debugdata]")
    return mini if mini.symtab is not None else None


Package = tuple[str, str]  # (package manager, package name)
_ASK = ("", "")


def debug_info_hint(path: str, build_id: str | None, package: Package | None = _ASK) -> str:
    """How to get symbols for `path`: its distribution's debug package, debuginfod, or a rebuild.

    `package` is what `owning_package(path)` answered, when the caller kept it (it runs the
    package manager, tens of milliseconds); by default it is asked here.
    """
    ways: list[str] = []
    if package == _ASK:
        package = owning_package(path)
    if package is not None:
        manager, name = package
        if manager == "dpkg":
            debug_package = "libc6-dbg" if name == "libc6" else f"{name}-dbgsym"
            ways.append(
                f"install {debug_package} (`apt-get install {debug_package}`; -dbgsym packages "
                "come from the debian-debug / ddebs archive)"
            )
        else:
            ways.append(f"install its debug info (`dnf debuginfo-install {name}`)")
    if build_id:
        ways.append(
            f"fetch it with debuginfod (`DEBUGINFOD_URLS=<server> debuginfod-find debuginfo "
            f"{build_id}`; probescope reads debuginfod's cache)"
        )
    ways.append("or build the program with -g and do not strip it")
    return "; ".join(ways)


def owning_package(path: str) -> Package | None:
    """(dpkg or rpm, the installed package that ships `path`), or None."""
    import shutil
    import subprocess

    real = os.path.realpath(path)
    for tool, args in (("dpkg-query", ["-S"]), ("rpm", ["-qf", "--qf", "%{NAME}"])):
        if shutil.which(tool) is None:
            continue
        for candidate in dict.fromkeys([real, _usr_merged(real), path]):
            try:
                result = subprocess.run(
                    [tool, *args, candidate], capture_output=True, text=True, timeout=5
                )
            except (OSError, subprocess.TimeoutExpired):
                return None
            if result.returncode != 0 or not result.stdout.strip():
                continue
            line = result.stdout.strip().splitlines()[0]
            if tool == "dpkg-query":
                return "dpkg", line.split(":", 1)[0].split(",")[0].strip()
            return "rpm", line.strip()
    return None


def _usr_merged(path: str) -> str:
    """`/usr/bin/x` → `/bin/x` and back: dpkg records the path the package shipped."""
    if path.startswith("/usr/"):
        return path[4:]
    return "/usr" + path
