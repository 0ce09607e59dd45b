"""Stacks as a self-contained interactive SVG flame graph, written by probescope itself.

The root is at the bottom and callers below callees, one box per frame with a width
proportional to its weight, as flamegraph.pl draws them. An embedded script gives: a tooltip
and a details line on hover, zoom by clicking a frame (its ancestors span the width, everything
beside it hides; "Reset Zoom" or a click on the background goes back), and search (the "Search"
button or Ctrl-F: matching frames turn magenta and the share of samples they cover shows).

The script keeps its state in the DOM (`data-zoomed`, `data-search`, `data-matched` on the
`<svg>`, `hidden` classes), and on load applies `#zoom=NAME`, `#click=NAME` (a synthetic click)
and `#search=REGEX` from the URL, so a headless browser's DOM dump shows that it works.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import IO
from xml.sax.saxutils import escape, quoteattr

from probescope.aggregate.maps import KEY_MODULE_PREFIX
from probescope.aggregate.render.folded import frame_name, is_kernel_frame
from probescope.aggregate.values import Frame, Stacks

WIDTH = 1200
FRAME_HEIGHT = 16
PAD = 10
TOP = 60
BOTTOM = 30
CHAR_WIDTH = 7.0
MIN_WIDTH = 0.1


@dataclass
class _Node:
    name: str
    module: str
    weight: int = 0
    children: dict[tuple[str, str], _Node] = field(default_factory=dict)


def _tree(stacks: Stacks) -> _Node:
    root = _Node("all", "")
    for stack, weight in stacks:
        root.weight += weight
        node = root
        for frame in reversed(stack):
            key = (frame_name(frame), frame.module)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(key[0], frame.module)
            child.weight += weight
            node = child
    return root


def _depth(node: _Node) -> int:
    return 1 + max((_depth(child) for child in node.children.values()), default=0)


def _colour(name: str, module: str) -> str:
    digest = hashlib.md5(name.encode("utf-8", "surrogateescape")).digest()
    a, b = digest[0] / 255, digest[1] / 255
    if module.startswith(KEY_MODULE_PREFIX):
        return f"rgb({int(150 + 50 * a)},{int(150 + 50 * a)},{int(190 + 50 * b)})"
    if is_kernel_frame(Frame(name, 0, module)):
        return f"rgb({int(200 + 55 * a)},{int(120 + 60 * b)},{int(40 * a)})"
    return f"rgb({int(205 + 50 * a)},{int(80 + 120 * b)},{int(30 + 40 * a)})"


def _label(name: str, width: float) -> str:
    chars = int((width - 6) / CHAR_WIDTH)
    if chars < 3:
        return ""
    return name if len(name) <= chars else name[: chars - 2] + ".."


def render_flamegraph(
    stacks: Stacks, stream: IO[str], *, title: str = "Flame Graph", unit: str | None = None
) -> None:
    root = _tree(stacks)
    unit = unit or stacks.unit
    levels = _depth(root)
    height = TOP + levels * FRAME_HEIGHT + BOTTOM
    scale = (WIDTH - 2 * PAD) / root.weight if root.weight else 0.0
    frames: list[str] = []

    def draw(node: _Node, x: int, depth: int) -> None:
        width = node.weight * scale
        if width < MIN_WIDTH and depth:
            return
        y = height - BOTTOM - (depth + 1) * FRAME_HEIGHT
        share = 100.0 * node.weight / root.weight if root.weight else 0.0
        tip = f"{node.name} ({node.weight:,} {unit}, {share:.2f}%)"
        if node.module and not node.module.startswith("["):
            tip += f" in {node.module}"
        frames.append(
            f'<g class="frame" data-name={quoteattr(node.name)} data-x="{x}" '
            f'data-w="{node.weight}" data-depth="{depth}">'
            f"<title>{escape(tip)}</title>"
            f'<rect x="{PAD + x * scale:.2f}" y="{y}" width="{width:.2f}" '
            f'height="{FRAME_HEIGHT - 1}" fill="{_colour(node.name, node.module)}" rx="2" ry="2"/>'
            f'<text x="{PAD + x * scale + 3:.2f}" y="{y + FRAME_HEIGHT - 4}">'
            f"{escape(_label(node.name, width))}</text></g>"
        )
        offset = x
        for key in sorted(node.children):
            child = node.children[key]
            draw(child, offset, depth + 1)
            offset += child.weight

    if root.weight:
        draw(root, 0, 0)
    stream.write(
        _DOCUMENT.format(
            width=WIDTH,
            height=height,
            total=root.weight,
            unit=escape(unit),
            title=escape(title),
            title_x=WIDTH // 2,
            detail_y=height - 10,
            script=_SCRIPT,
            frames="\n".join(frames),
            frame_height=FRAME_HEIGHT,
            pad=PAD,
            char_width=CHAR_WIDTH,
        )
    )


_DOCUMENT = """<?xml version="1.0" standalone="no"?>
<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" \
viewBox="0 0 {width} {height}" onload="init(evt)" data-total="{total}" data-unit="{unit}" \
data-zoomed="" data-search="" data-matched="">
<style type="text/css">
text {{ font-family: monospace; font-size: 12px; fill: rgb(0,0,0); }}
#title {{ text-anchor: middle; font-size: 17px; }}
.frame:hover rect {{ stroke: black; stroke-width: 0.5; cursor: pointer; }}
.hidden {{ display: none; }}
.parent rect {{ opacity: 0.5; }}
#search, #unzoom {{ cursor: pointer; }}
#unzoom.hidden {{ display: none; }}
</style>
<script type="text/ecmascript"><![CDATA[
var FRAME_HEIGHT = {frame_height}, PAD = {pad}, CHAR_WIDTH = {char_width};
{script}
]]></script>
<rect x="0" y="0" width="{width}" height="{height}" fill="rgb(250,250,240)" id="background"/>
<text id="title" x="{title_x}" y="24">{title}</text>
<text id="unzoom" class="hidden" x="{pad}" y="24">Reset Zoom</text>
<text id="search" x="{width}" y="24" text-anchor="end" dx="-{pad}">Search</text>
<text id="matched" x="{width}" y="{detail_y}" text-anchor="end" dx="-{pad}"> </text>
<text id="details" x="{pad}" y="{detail_y}"> </text>
<g id="frames">
{frames}
</g>
</svg>
"""

_SCRIPT = r"""
var svg, frames, details, total, unit, width;
function init(evt) {
  svg = document.documentElement;
  frames = Array.prototype.slice.call(document.querySelectorAll("g.frame"));
  details = document.getElementById("details").firstChild;
  total = parseFloat(svg.getAttribute("data-total"));
  unit = svg.getAttribute("data-unit");
  width = parseFloat(svg.getAttribute("width")) - 2 * PAD;
  frames.forEach(function (g) {
    g.addEventListener("click", function (e) { zoom(g); e.stopPropagation(); });
    g.addEventListener("mouseover", function () {
      details.nodeValue = g.querySelector("title").textContent;
    });
    g.addEventListener("mouseout", function () { details.nodeValue = " "; });
  });
  document.getElementById("unzoom").addEventListener("click", unzoom);
  document.getElementById("background").addEventListener("click", unzoom);
  document.getElementById("search").addEventListener("click", function () {
    var term = prompt("Search for (regular expression):", svg.getAttribute("data-search"));
    if (term !== null) { search(term); }
  });
  window.addEventListener("keydown", function (e) {
    if (e.ctrlKey && e.key === "f") {
      e.preventDefault();
      var term = prompt("Search for (regular expression):", svg.getAttribute("data-search"));
      if (term !== null) { search(term); }
    }
  });
  applyHash();
}
function attr(g, name) { return parseFloat(g.getAttribute(name)); }
function byName(name) {
  var best = null;
  frames.forEach(function (g) {
    var wider = best === null || attr(g, "data-w") > attr(best, "data-w");
    if (g.getAttribute("data-name") === name && wider) { best = g; }
  });
  return best;
}
function applyHash() {
  var hash = decodeURIComponent((window.location.hash || "").replace(/^#/, ""));
  hash.split("&").forEach(function (part) {
    var eq = part.indexOf("=");
    if (eq < 0) { return; }
    var key = part.slice(0, eq), value = part.slice(eq + 1), g;
    if (key === "zoom" && (g = byName(value))) { zoom(g); }
    if (key === "click" && (g = byName(value))) {
      g.dispatchEvent(new MouseEvent("click", {bubbles: true}));
    }
    if (key === "search") { search(value); }
  });
}
function place(g, x, w) {
  var rect = g.querySelector("rect"), text = g.querySelector("text");
  rect.setAttribute("x", (PAD + x).toFixed(2));
  rect.setAttribute("width", w.toFixed(2));
  text.setAttribute("x", (PAD + x + 3).toFixed(2));
  var name = g.getAttribute("data-name"), chars = Math.floor((w - 6) / CHAR_WIDTH);
  var shown = name.length <= chars ? name : name.slice(0, chars - 2) + "..";
  text.textContent = chars < 3 ? "" : shown;
}
function zoom(target) {
  var x0 = attr(target, "data-x"), w0 = attr(target, "data-w"), d0 = attr(target, "data-depth");
  var scale = width / w0;
  frames.forEach(function (g) {
    var x = attr(g, "data-x"), w = attr(g, "data-w"), d = attr(g, "data-depth");
    g.classList.remove("hidden"); g.classList.remove("parent");
    if (d < d0 && x <= x0 && x + w >= x0 + w0) {
      g.classList.add("parent"); place(g, 0, width);
    } else if (d >= d0 && x >= x0 && x + w <= x0 + w0 && w * scale >= 0.1) {
      place(g, (x - x0) * scale, w * scale);
    } else {
      g.classList.add("hidden");
    }
  });
  svg.setAttribute("data-zoomed", target.getAttribute("data-name"));
  document.getElementById("unzoom").classList.remove("hidden");
}
function unzoom() {
  var scale = width / total;
  frames.forEach(function (g) {
    g.classList.remove("hidden"); g.classList.remove("parent");
    place(g, attr(g, "data-x") * scale, attr(g, "data-w") * scale);
  });
  svg.setAttribute("data-zoomed", "");
  document.getElementById("unzoom").classList.add("hidden");
}
function search(term) {
  var re, spans = [], matched = 0, end = -1;
  try { re = new RegExp(term); } catch (e) { return; }
  frames.forEach(function (g) {
    var rect = g.querySelector("rect");
    if (!rect.hasAttribute("data-fill")) {
      rect.setAttribute("data-fill", rect.getAttribute("fill"));
    }
    var hit = term !== "" && re.test(g.getAttribute("data-name"));
    rect.setAttribute("fill", hit ? "rgb(230,0,230)" : rect.getAttribute("data-fill"));
    g.classList.toggle("match", hit);
    if (hit) { spans.push([attr(g, "data-x"), attr(g, "data-w")]); }
  });
  spans.sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
  spans.forEach(function (s) {
    var start = Math.max(s[0], end), stop = s[0] + s[1];
    if (stop > start) { matched += stop - start; end = stop; }
  });
  var share = total ? (100 * matched / total).toFixed(1) : "0.0";
  svg.setAttribute("data-search", term);
  svg.setAttribute("data-matched", term === "" ? "" : share);
  var line = document.getElementById("matched").firstChild;
  line.nodeValue = term === "" ? " " : "Matched: " + share + "%";
}
"""
