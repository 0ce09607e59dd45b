"""The SVG flame graph in a real browser (Debian's headless chromium): it paints, and its
script zooms on a click and finds frames by search, as the DOM it leaves shows."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from probescope.aggregate.render.flamegraph import render_flamegraph
from probescope.aggregate.values import Frame, Stacks

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (Debian package chromium)")
    return found


def browse(svg: Path, *extra: str, fragment: str = "") -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", *extra, svg.as_uri() + fragment],
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def svg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    stacks = Stacks()
    main, start = Frame("main", 20, "/bin/prog"), Frame("_start", 33, "/bin/prog")
    for index in range(12):
        middle = Frame(f"handler_{index % 4}", 8, "/bin/prog")
        stacks.add((Frame("malloc", 0, "/lib/libc.so.6"), middle, main, start), 10 + index)
    stacks.add((Frame("vfs_read", 4, "[kernel]"), Frame("read", 9, "/lib/libc.so.6"), main), 40)
    path = tmp_path_factory.mktemp("flame") / "flame.svg"
    with path.open("w") as stream:
        render_flamegraph(stacks, stream, title="test stacks")
    return path


def pixels(png: bytes) -> list[bytes]:
    """Rows of RGB(A) pixels of a non-interlaced 8-bit PNG (what chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, data, header = 8, b"", b""
    while position < len(png):
        (length,), kind = (
            struct.unpack(">I", png[position : position + 4]),
            png[position + 4 : position + 8],
        )
        body = png[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            data += body
        position += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)
    step = 4 if colour == 6 else 3
    raw = zlib.decompress(data)
    stride = width * step
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            left = line[x - step] if x >= step else 0
            up, corner = previous[x], previous[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (
                    line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)
                ) & 0xFF
        rows.append(bytes(line))
        previous = line
    return rows


def test_the_graph_paints(svg: Path, tmp_path: Path) -> None:
    shot = tmp_path / "flame.png"
    result = browse(svg, f"--screenshot={shot}", "--window-size=1200,300")
    assert shot.exists(), result.stderr[-2000:]
    rows = pixels(shot.read_bytes())
    colours = {row[i : i + 3] for row in rows[::4] for i in range(0, len(row), 3 * 8)}
    assert len(colours) > 10  # frames in many colours, not a blank page
    warm = [c for c in colours if c[0] > 190 and c[2] < 120]  # flame colours
    assert warm


def test_click_zooms_and_search_matches(svg: Path) -> None:
    result = browse(svg, "--dump-dom", fragment="#click=handler_1&search=^mall")
    dom = result.stdout
    root = re.search(r"<svg[^>]*>", dom)
    assert root is not None, result.stderr[-2000:]
    assert 'data-zoomed="handler_1"' in root.group(0)
    assert 'data-search="^mall"' in root.group(0)
    # malloc frames cover 10+11+...+21 = 186 of 226 samples: 82.3%
    assert 'data-matched="82.3"' in root.group(0)
    assert "Matched: 82.3%" in dom
    hidden = re.findall(r'<g class="frame hidden" data-name="([^"]+)"', dom)
    assert "handler_0" in hidden and "read" in hidden and "handler_1" not in hidden
    parents = re.findall(r'<g class="frame parent" data-name="([^"]+)"', dom)
    assert set(parents) == {"all", "_start", "main"}


def test_reset_zoom_restores(svg: Path) -> None:
    plain = browse(svg, "--dump-dom").stdout
    assert 'data-zoomed=""' in plain
    assert 'class="frame hidden"' not in plain
