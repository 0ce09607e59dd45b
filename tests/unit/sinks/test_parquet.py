"""The Parquet output is one typed table: uint64 addresses exact, arguments as struct columns
of their own types, rows in time order; DuckDB queries it without probescope."""

from __future__ import annotations

import io

import pytest

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.sinks.base import open_sink
from probescope.traceevent.context import KernelContext

pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

A = EventType(
    "u",
    "a",
    ProbeKind.UPROBE,
    ("n", "s", "arr"),
    (
        ArgType("s32", "s32", 4, True),
        ArgType("string", "string", 4, False),
        ArgType("x8[2]", "x8", 1, False, count=2),
    ),
)
B = EventType(
    "k", "a", ProbeKind.TRACEPOINT, ("comm",), (ArgType("char[16]", "string", 16, False),)
)


def test_a_typed_table_that_duckdb_counts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    top = 0xFFFFFFFF81000000
    events = [
        Event(
            2**63 + i,
            i % 2,
            10,
            11,
            "w",
            A,
            ip=top + i,
            args=(-i, None if i == 3 else f"s{i}", (1, 255)),
        )
        for i in range(6)
    ]
    events.insert(2, Event(2**63 + 1, 0, 0, 0, "<idle>", B, args=("swapper",)))
    path = tmp_path / "t.parquet"
    with open(path, "wb") as stream:
        sink = open_sink("parquet", stream, context=KernelContext(release="6.18.0"), host="h1")
        sink.write_batch(EventBatch(events[:4], lost=3))
        sink.write_batch(EventBatch(events[4:]))
        sink.close()
    table = pq.read_table(path)
    schema = {f.name: str(f.type) for f in table.schema}
    assert schema["ts"] == "uint64" and schema["ip"] == "uint64"
    assert schema["args_a"] == "struct<n: int32, s: string, arr: list<element: uint8>>"
    assert schema["args_k_a"] == "struct<comm: string>"
    assert table.column("ip").to_pylist()[0] == top
    assert table.column("ts").to_pylist() == sorted(table.column("ts").to_pylist())
    assert table.schema.metadata[b"probescope.lost"] == b"3"
    rows = duckdb.sql(
        f"select event, \"group\", count(*), min(args_a.n), count(args_a.s) from '{path}' "
        "group by all order by all"
    ).fetchall()
    assert rows == [("a", "k", 1, None, 0), ("a", "u", 6, -5, 5)]
    assert duckdb.sql(f"select distinct host, release from '{path}'").fetchall() == [
        ("h1", "6.18.0")
    ]


def test_an_empty_session_writes_an_empty_table() -> None:
    out = io.BytesIO()
    sink = open_sink("parquet", out)
    sink.close()
    assert pq.read_table(io.BytesIO(out.getvalue())).num_rows == 0


def test_events_without_arguments_and_hidden_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An event with no argument to show has no struct column (Parquet holds no empty struct);
    arguments probescope fetched for itself (__ps_*) are left out as every sink leaves them."""
    bare = EventType("u", "bare", ProbeKind.URETPROBE)
    hidden = EventType(
        "u",
        "entry",
        ProbeKind.UPROBE,
        ("size", "__ps_ret"),
        (ArgType("u64", "u64", 8, False), ArgType("x64", "x64", 8, False)),
    )
    only_hidden = EventType(
        "u", "alone", ProbeKind.UPROBE, ("__ps_ret",), (ArgType("x64", "x64", 8, False),)
    )
    events = [
        Event(1, 0, 1, 1, "p", bare, ip=1, ret_ip=2),
        Event(2, 0, 1, 1, "p", hidden, ip=1, args=(7, 0x4000)),
        Event(3, 0, 1, 1, "p", only_hidden, ip=1, args=(0x4000,)),
    ]
    path = tmp_path / "t.parquet"
    with open(path, "wb") as stream:
        sink = open_sink("parquet", stream)
        sink.write_batch(EventBatch(events))
        sink.close()
    schema = {f.name: str(f.type) for f in pq.read_table(path).schema}
    assert [name for name in schema if name.startswith("args_")] == ["args_entry"]
    assert schema["args_entry"] == "struct<size: uint64>"
    assert duckdb.sql(f"select event, args_entry.size from '{path}' order by ts").fetchall() == [
        ("bare", None),
        ("entry", 7),
        ("alone", None),
    ]
