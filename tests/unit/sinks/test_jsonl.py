"""JSON Lines output: typed values, argument order, losses."""

from __future__ import annotations

import io
import json

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.sinks.jsonl import JsonLinesSink

TYPE = EventType(
    "grp",
    "ret",
    ProbeKind.URETPROBE,
    ("z", "a", "text", "arr", "raw", "bad"),
    (
        ArgType("s32", "s32", 4, True),
        ArgType("char", "char", 1, False),
        ArgType("string", "string", 4, False),
        ArgType("u8", "u8", 1, False, count=2),
        ArgType("char x[2]", "bytes", 2, False),
        ArgType("string", "string", 4, False),
    ),
)
EVENT = Event(
    1354_187408_123,
    1,
    100,
    101,
    "worker",
    TYPE,
    ip=0xFFFF_FFFF_8100_0000,
    ret_ip=0x5555_0000_1000,
    args=(-3, "Z", "h\udcff", (1, 2), b"\x00\x01", None),
    flags=0xFF,
    preempt_count=3,
)


def test_event_object() -> None:
    line = JsonLinesSink(io.StringIO()).format(EVENT)
    assert line.endswith("\n") and "\n" not in line[:-1]
    record = json.loads(line)
    assert list(record) == [
        "ts",
        "cpu",
        "pid",
        "tid",
        "comm",
        "group",
        "event",
        "kind",
        "ip",
        "ret_ip",
        "args",
        "common_flags",
        "common_preempt_count",
    ]
    assert record["ts"] == 1354_187408_123 and record["ip"] == 0xFFFF_FFFF_8100_0000
    assert (record["group"], record["event"], record["kind"]) == ("grp", "ret", "uretprobe")
    assert list(record["args"].items()) == [
        ("z", -3),
        ("a", "Z"),
        ("text", "h\udcff"),
        ("arr", [1, 2]),
        ("raw", "0001"),
        ("bad", None),
    ]
    assert line.isascii()


def test_entry_events_have_a_null_return_address() -> None:
    entry = EVENT._replace(type=EventType("g", "e", ProbeKind.UPROBE), ret_ip=None, args=())
    record = json.loads(JsonLinesSink(io.StringIO()).format(entry))
    assert record["ret_ip"] is None and record["args"] == {} and record["kind"] == "uprobe"


def test_batches_losses_and_binary_streams() -> None:
    stream = io.BytesIO()
    sink = JsonLinesSink(stream)
    sink.write_batch(EventBatch([EVENT], lost=5, cpu=1))
    sink.write_batch(EventBatch([], lost=-1, cpu=0))
    sink.write(EVENT)
    sink.close()
    lines = [json.loads(line) for line in stream.getvalue().decode("ascii").splitlines()]
    assert lines[0] == {"lost": 5, "cpu": 1}
    assert lines[1]["event"] == "ret"
    assert lines[2] == {"lost": None, "cpu": 0}
    assert lines[3] == lines[1]
    assert not stream.closed


def test_compiled_lines_equal_the_json_encoder_on_captured_events() -> None:
    """The per-type compiled printer writes exactly what the JSON encoder writes for `record`,
    on every event decoded from the pages captured from the kernel (with and without specs)."""
    from fixtures.captured import case_paths, load_case
    from probescope.sinks.jsonl import _encode

    checked = 0
    for path in case_paths():
        case = load_case(path)
        for with_specs in (True, False):
            sink = JsonLinesSink(io.StringIO())
            for event in case.events(case.decoder(with_specs=with_specs)):
                expected = _encode(sink.record(event)) + "\n"
                assert sink.format(event) == expected
                assert json.loads(expected) == sink.record(event)
                checked += 1
    assert checked > 1000
