"""Renderers: bpftrace's text and JSON layouts (expected text captured from bpftrace 0.17 on
the same values), folded stacks, speedscope documents, and the SVG flame graph's structure."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ElementTree

from probescope.aggregate.maps import AggregateMap, Aggregation, Span
from probescope.aggregate.render.flamegraph import render_flamegraph
from probescope.aggregate.render.folded import folded_lines
from probescope.aggregate.render.json_records import render_json
from probescope.aggregate.render.speedscope import speedscope_document
from probescope.aggregate.render.text import render_text
from probescope.aggregate.values import Count, Frame, Histogram, Latency, LinearScale, Stacks

# bpftrace prints a space after the colon of a histogram map's name line.
# arg0 of 20 calls: 0 ×3, 100 ×3, 200 ×3, 300 ×3, 400 ×3, 500 ×3, 600 ×2
VALUES = [0] * 3 + [100] * 3 + [200] * 3 + [300] * 3 + [400] * 3 + [500] * 3 + [600] * 2

BPFTRACE_HIST = """\
@h:{TRAILING}
[0]                    3 |@@@@@@@@@@@@@@@@@                                   |
[1]                    0 |                                                    |
[2, 4)                 0 |                                                    |
[4, 8)                 0 |                                                    |
[8, 16)                0 |                                                    |
[16, 32)               0 |                                                    |
[32, 64)               0 |                                                    |
[64, 128)              3 |@@@@@@@@@@@@@@@@@                                   |
[128, 256)             3 |@@@@@@@@@@@@@@@@@                                   |
[256, 512)             9 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[512, 1K)              2 |@@@@@@@@@@@                                         |

""".format(TRAILING=" ")

BPFTRACE_LHIST = """\
@lo:{TRAILING}
(..., 100)             3 |@@@@@@@@@@@@@@                                      |
[100, 200)             3 |@@@@@@@@@@@@@@                                      |
[200, 300)             3 |@@@@@@@@@@@@@@                                      |
[300, ...)            11 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

""".format(TRAILING=" ")


def histogram(values: list[int], scale: LinearScale | None = None) -> Histogram:
    result = Histogram(scale) if scale else Histogram()
    for value in values:
        result.add(value)
    return result


def text(*maps: AggregateMap) -> str:
    stream = io.StringIO()
    render_text(Aggregation(list(maps)), stream)
    return stream.getvalue()


def test_log2_histogram_text_is_bpftraces() -> None:
    assert text(AggregateMap("@h", (), {(): histogram(VALUES)})) == BPFTRACE_HIST


def test_linear_histogram_text_is_bpftraces() -> None:
    scale = LinearScale(100, 300, 100)
    assert text(AggregateMap("@lo", (), {(): histogram(VALUES, scale)})) == BPFTRACE_LHIST


def test_big_linear_labels() -> None:
    scale = LinearScale(0, 4 << 20, 1 << 20)
    rendered = text(AggregateMap("@big", (), {(): histogram([v << 12 for v in VALUES], scale)}))
    assert rendered.splitlines()[1:4] == [
        "[0, 1M)                9 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|",
        "[1M, 2M)               9 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|",
        "[2M, 3M)               2 |@@@@@@@@@@@                                         |",
    ]


def test_count_maps_smallest_first() -> None:
    counts = AggregateMap("@c", ("comm", "pid"), {("t", 26920): Count(20), ("sh", 1): Count(3)})
    assert text(counts) == "@c[sh, 1]: 3\n@c[t, 26920]: 20\n\n"
    assert text(AggregateMap("@n", (), {(): Count(20)})) == "@n: 20\n\n"


def test_stack_keys_print_a_frame_per_line() -> None:
    stack = (Frame("work", 0, "/t"), Frame("main", 38, "/t"))
    rendered = text(AggregateMap("@s", ("ustack", "comm"), {(stack, "t"): Count(20)}))
    assert rendered == "@s[\n    work\n    main+38\n, t]: 20\n\n"


def test_latency_prints_histogram_and_stats() -> None:
    value = Latency("us")
    for ns in (1_500, 2_500, 3_200):
        value.add(ns)
    rendered = text(AggregateMap("@latency_us", ("probe",), {("f",): value}))
    assert rendered.startswith("@latency_us[f]: \n[1]  ")
    assert rendered.endswith(
        "@latency_us_stats[f]: count 3, average 2us, total 7us, min 1us, max 3us\n\n"
    )


def test_json_is_bpftraces() -> None:
    stream = io.StringIO()
    scale = LinearScale(100, 300, 100)
    render_json(
        Aggregation(
            [
                AggregateMap("@c", ("comm", "pid"), {("t", 27542): Count(20)}),
                AggregateMap("@h", (), {(): histogram(VALUES)}),
                AggregateMap("@lo", (), {(): histogram(VALUES, scale)}),
                AggregateMap("@n", (), {(): Count(20)}),
            ],
            {"lost events": 2},
        ),
        stream,
    )
    lines = stream.getvalue().splitlines()
    assert lines[0] == '{"type": "map", "data": {"@c": {"t,27542": 20}}}'
    assert lines[1].startswith(
        '{"type": "hist", "data": {"@h": [{"min": 0, "max": 0, "count": 3}, '
        '{"min": 1, "max": 1, "count": 0}, {"min": 2, "max": 3, "count": 0}'
    )
    assert lines[2] == (
        '{"type": "hist", "data": {"@lo": [{"max": 99, "count": 3}, {"min": 100, "max": 199, '
        '"count": 3}, {"min": 200, "max": 299, "count": 3}, {"min": 300, "count": 11}]}}'
    )
    assert lines[3] == '{"type": "map", "data": {"@n": 20}}'
    assert json.loads(lines[4]) == {"type": "counters", "data": {"lost events": 2}}


def stacks() -> Stacks:
    main = Frame("main", 10, "/bin/p")
    result = Stacks()
    result.add((Frame("leaf", 0, "/bin/p"), Frame("a", 5, "/bin/p"), main), 3)
    result.add((Frame("leaf", 0, "/bin/p"), Frame("b", 9, "/bin/p"), main), 1)
    result.add((Frame("do;it", 0, "/bin/p"), main), 2)
    result.add((Frame("vfs_read", 4, "[kernel]"), Frame("read", 8, "/lib/libc.so.6")), 5)
    return result


def test_folded() -> None:
    assert folded_lines(stacks()) == [
        "main;a;leaf 3",
        "main;b;leaf 1",
        "main;do:it 2",
        "read;vfs_read_[k] 5",
    ]


def test_speedscope_sampled_profile() -> None:
    document = speedscope_document(stacks(), name="t")
    (profile,) = document["profiles"]
    assert profile["type"] == "sampled" and profile["endValue"] == 11
    names = [f["name"] for f in document["shared"]["frames"]]
    samples = [[names[i] for i in sample] for sample in profile["samples"]]
    assert ["main", "a", "leaf"] in samples
    assert (
        dict(zip(map(tuple, samples), profile["weights"], strict=True))[("main", "a", "leaf")] == 3
    )


def test_speedscope_evented_profile_nests_recursion() -> None:
    calls = [
        Span(1, 1, "p", 100, 400, "fib"),
        Span(1, 1, "p", 150, 250, "fib"),
        Span(1, 1, "p", 260, 300, "fib"),
        Span(1, 2, "p", 120, 130, "fib"),
    ]
    document = speedscope_document(None, calls)
    first, second = document["profiles"]
    assert first["type"] == "evented" and second["name"].startswith("p-2")
    depth, opened = 0, 0
    for event in first["events"]:
        depth += 1 if event["type"] == "O" else -1
        assert depth >= 0
        opened = max(opened, depth)
    assert depth == 0 and opened == 2
    assert [e["at"] for e in first["events"]] == sorted(e["at"] for e in first["events"])
    assert sum(e["type"] == "O" for e in first["events"]) == 3


def test_flamegraph_svg_structure() -> None:
    stream = io.StringIO()
    render_flamegraph(stacks(), stream, title="t")
    root = ElementTree.fromstring(stream.getvalue())
    svg = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{svg}svg" and root.get("data-total") == "11"
    frames = root.findall(f".//{svg}g[@class='frame']")
    by_name = {g.get("data-name"): g for g in frames}
    assert by_name["all"].get("data-w") == "11"
    assert by_name["main"].get("data-w") == "6"
    assert by_name["vfs_read_[k]"].get("data-depth") == "2"
    title = by_name["main"].find(f"{svg}title")
    assert title is not None and title.text == "main (6 samples, 54.55%) in /bin/p"
    assert root.find(f"{svg}script") is not None
