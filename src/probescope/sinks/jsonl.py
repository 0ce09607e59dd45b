"""JSON Lines output: one JSON object per event, typed values, arguments in probe order.

An event line holds `ts` (the trace clock in nanoseconds), `cpu`, `pid` (tgid), `tid`, `comm`,
`group`, `event`, `kind`, `ip` and `ret_ip` (integers; `ret_ip` is null for entries), `args`
(an object whose keys keep the probe's argument order: integers, one-character strings for
`char`, strings or null for a faulted string read, arrays for arrays, hex text for raw bytes)
and `common_flags`/`common_preempt_count`. Addresses are plain integers rather than hex text so
they compare and sort as numbers; kernel addresses exceed 2**53, so JavaScript readers need a
big-integer-safe parser. A loss is its own line: `{"lost": N, "cpu": C}` (`"lost": null` when
the kernel did not say how many). Output is ASCII: bytes that are not UTF-8 appear as
`\\udcXX` escapes (Python's surrogateescape convention).
"""

from __future__ import annotations

import json
from typing import IO, Any

from probescope.events import Event, EventBatch, EventType
from probescope.sinks.base import OutputFormat, is_binary_stream

_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


class JsonLinesSink:
    """Writes one JSON object per event (and per loss) to a text or binary stream."""

    def __init__(self, stream: IO[Any], *, binary: bool | None = None) -> None:
        self.stream = stream
        self.binary = is_binary_stream(stream) if binary is None else binary
        self._heads: dict[EventType, dict[str, Any]] = {}

    def record(self, event: Event) -> dict[str, Any]:
        """The JSON object of one event, as a dict."""
        head = self._heads.get(event.type)
        if head is None:
            head = self._heads[event.type] = {
                "group": event.type.group,
                "event": event.type.name,
                "kind": str(event.type.kind),
            }
        return {
            "ts": event.timestamp_ns,
            "cpu": event.cpu,
            "pid": event.pid,
            "tid": event.tid,
            "comm": event.comm,
            **head,
            "ip": event.ip,
            "ret_ip": event.ret_ip,
            "args": dict(zip(event.type.arg_names, map(_json_value, event.args), strict=False)),
            "common_flags": event.flags,
            "common_preempt_count": event.preempt_count,
        }

    def format(self, event: Event) -> str:
        return _encode(self.record(event)) + "\n"

    def write(self, event: Event) -> None:
        self._emit(self.format(event))

    def write_batch(self, batch: EventBatch) -> None:
        lines = []
        if batch.lost:
            lines.append(
                _encode({"lost": batch.lost if batch.lost > 0 else None, "cpu": batch.cpu}) + "\n"
            )
        lines += [_encode(self.record(event)) + "\n" for event in batch.events]
        self._emit("".join(lines))

    def close(self) -> None:
        self.stream.flush()

    def _emit(self, text: str) -> None:
        self.stream.write(text.encode("ascii") if self.binary else text)


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


JSONL_FORMAT = OutputFormat(
    name="jsonl",
    description="one JSON object per event, typed values",
    factory=JsonLinesSink,
)
