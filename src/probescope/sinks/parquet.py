"""One typed Parquet table of events (`pip install probescope[parquet]`, pyarrow): what DuckDB,
pandas, Polars, Spark or Trino query without probescope, across a fleet's recordings.

Columns: `host` and `release` (of the recording, for queries over many hosts' files), `ts`
(trace clock ns, uint64), `cpu`, `pid`, `tid`, `comm`, `group`, `event`, `kind`, `ip` and
`ret_ip` (uint64, exact: kernel addresses exceed 2**63), `common_flags`,
`common_preempt_count`, and per event type with arguments one struct column `args_EVENT`
(`args_GROUP_EVENT` when two groups share an event name) holding its arguments (those probescope
fetched for itself, `__ps_*`, left out) typed as recorded:
integers of their width and signedness, strings (null: the read faulted), lists for arrays,
binary for raw bytes. Rows of other events hold null there. Events are converted to Arrow
arrays batch by batch and the file is written at `close()`, when every event type is known.
"""

from __future__ import annotations

import re
from typing import IO, Any

from probescope.errors import ProbescopeError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import STRING_TYPES, ArgType
from probescope.sinks.base import OutputFormat
from probescope.traceevent.context import KernelContext

ROW_GROUP = 131072
_NAME = re.compile(r"[^A-Za-z0-9_]")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ProbescopeError(
            "the parquet output needs pyarrow", hint="pip install 'probescope[parquet]'"
        ) from None
    return pyarrow


def arrow_type(pa: Any, arg_type: ArgType) -> Any:
    """The Arrow type of one argument's values."""
    base = arg_type.base
    if base in STRING_TYPES or base == "char":
        element = pa.string()
    elif base == "bytes":
        element = pa.binary()
    else:
        bits = {1: 8, 2: 16, 4: 32, 8: 64}.get(arg_type.size, 64)
        signed = arg_type.signed and not arg_type.is_hex
        element = getattr(pa, f"{'int' if signed else 'uint'}{bits}")()
    return pa.list_(element) if arg_type.count else element


class ParquetSink:
    """Collects events as Arrow record batches; `close()` writes the Parquet file."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        context: KernelContext | None = None,
        host: str = "",
        compression: str = "zstd",
    ) -> None:
        self.pa = _pyarrow()
        self.stream = stream
        self.context = context or KernelContext()
        self.host = host
        self.compression = compression
        self.lost = 0
        self.rows = 0
        self._columns: dict[EventType, str | None] = {}
        self._names: dict[str, EventType] = {}
        self._struct_types: dict[str, Any] = {}
        self._pieces: list[tuple[Any, str | None]] = []
        self._closed = False

    def _column(self, event_type: EventType) -> str | None:
        """The struct column of this type's arguments; None when it has none to show (Parquet
        holds no struct without fields)."""
        if event_type in self._columns:
            return self._columns[event_type]
        shown = event_type.shown_arguments()
        if not shown:
            self._columns[event_type] = None
            return None
        column = "args_" + _NAME.sub("_", event_type.name)
        other = self._names.get(column)
        if other is not None and (other.group, other.name) != (event_type.group, event_type.name):
            column = "args_" + _NAME.sub("_", f"{event_type.group}_{event_type.name}")
        self._names.setdefault(column, event_type)
        self._columns[event_type] = column
        pa = self.pa
        fields = [pa.field(name or f"arg{i}", arrow_type(pa, t)) for i, name, t in shown]
        self._struct_types.setdefault(column, pa.struct(fields))
        return column

    def write(self, event: Event) -> None:
        self.write_batch(EventBatch([event]))

    def write_batch(self, batch: EventBatch) -> None:
        self.lost += max(batch.lost, 0)
        by_type: dict[EventType, list[Event]] = {}
        for event in batch.events:
            by_type.setdefault(event.type, []).append(event)
        for event_type, events in by_type.items():
            self._pieces.append((self._table(event_type, events), self._column(event_type)))
        self.rows += len(batch.events)

    def _table(self, event_type: EventType, events: list[Event]) -> Any:
        pa = self.pa
        column = self._column(event_type)
        count = len(events)
        piece: dict[str, Any] = {}
        if column is not None:
            struct_type = self._struct_types[column]
            arg_columns = [
                pa.array([_plain(e.args[index]) for e in events], type=field.type)
                for field, (index, _, _) in zip(
                    struct_type, event_type.shown_arguments(), strict=True
                )
            ]
            piece[column] = pa.StructArray.from_arrays(arg_columns, fields=list(struct_type))
        return piece | {
            "ts": pa.array([e.timestamp_ns for e in events], pa.uint64()),
            "cpu": pa.array([e.cpu for e in events], pa.int32()),
            "pid": pa.array([e.pid for e in events], pa.int32()),
            "tid": pa.array([e.tid for e in events], pa.int32()),
            "comm": pa.array([e.comm for e in events], pa.string()),
            "group": pa.array([event_type.group] * count, pa.string()),
            "event": pa.array([event_type.name] * count, pa.string()),
            "kind": pa.array([str(event_type.kind)] * count, pa.string()),
            "ip": pa.array([e.ip & 0xFFFFFFFFFFFFFFFF for e in events], pa.uint64()),
            "ret_ip": pa.array([e.ret_ip for e in events], pa.uint64()),
            "common_flags": pa.array([e.flags for e in events], pa.uint8()),
            "common_preempt_count": pa.array([e.preempt_count for e in events], pa.uint8()),
        }

    def flush(self) -> None:
        """Nothing reaches the stream before close(): Parquet's footer holds the schema."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pa = self.pa
        common = [
            ("host", pa.string()),
            ("release", pa.string()),
            ("ts", pa.uint64()),
            ("cpu", pa.int32()),
            ("pid", pa.int32()),
            ("tid", pa.int32()),
            ("comm", pa.string()),
            ("group", pa.string()),
            ("event", pa.string()),
            ("kind", pa.string()),
            ("ip", pa.uint64()),
            ("ret_ip", pa.uint64()),
            ("common_flags", pa.uint8()),
            ("common_preempt_count", pa.uint8()),
        ]
        columns = sorted(self._struct_types)
        schema = pa.schema(
            [pa.field(n, t) for n, t in common]
            + [pa.field(c, self._struct_types[c]) for c in columns],
            metadata={
                b"probescope.host": self.host.encode(),
                b"probescope.release": (self.context.release or "").encode(),
                b"probescope.lost": str(self.lost).encode(),
            },
        )
        release = self.context.release or ""
        tables = []
        for piece, own in self._pieces:
            count = len(piece["ts"])
            arrays = [
                pa.array([self.host] * count, pa.string()),
                pa.array([release] * count, pa.string()),
            ]
            arrays += [piece[name] for name, _ in common[2:]]
            arrays += [
                piece[c] if c == own else pa.nulls(count, self._struct_types[c]) for c in columns
            ]
            tables.append(pa.Table.from_arrays(arrays, schema=schema))
        self._pieces.clear()
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        if len(tables) > 1:
            table = table.sort_by([("ts", "ascending")])
        pa.parquet.write_table(
            table.combine_chunks(),
            self.stream,
            row_group_size=ROW_GROUP,
            compression=self.compression,
        )
        self.stream.flush()


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


PARQUET_FORMAT = OutputFormat(
    name="parquet",
    description="one typed Parquet table (pyarrow: pip install probescope[parquet])",
    factory=ParquetSink,
    binary=True,
)
