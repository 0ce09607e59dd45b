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

import functools
import json
from collections.abc import Callable
from typing import IO, Any

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import STRING_TYPES, ArgType
from probescope.sinks.base import OutputFormat, StreamWatch, is_binary_stream
from probescope.traceevent.context import KernelContext

_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
_FIELD = {name: index for index, name in enumerate(Event._fields)}


class JsonLinesSink:
    """Writes one JSON object per event (and per loss) to a text or binary stream.

    Each event type gets a line printer compiled once (a %-template with an expression per
    value), several times faster than building a dict per event for the JSON encoder. Values
    are written as recorded (addresses as integers), so the `context` every sink is given is
    kept but not needed.
    """

    def __init__(
        self,
        stream: IO[Any],
        *,
        context: KernelContext | None = None,
        binary: bool | None = None,
    ) -> None:
        self.stream = stream
        self._watch = StreamWatch(stream)
        self.kernel = context or KernelContext()
        self.binary = is_binary_stream(stream) if binary is None else binary
        self._heads: dict[EventType, dict[str, Any]] = {}
        self._lines: dict[EventType, Callable[[Event], str]] = {}

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
            "args": {
                name: _json_value(event.args[index])
                for index, name, _ in event.type.shown_arguments()
            },
            "common_flags": event.flags,
            "common_preempt_count": event.preempt_count,
        }

    def format(self, event: Event) -> str:
        line = self._lines.get(event.type)
        if line is None:
            line = self._lines[event.type] = _line_printer(event.type)
        return line(event)

    def write(self, event: Event) -> None:
        self._emit(self.format(event))

    def write_batch(self, batch: EventBatch) -> None:
        lines = []
        if batch.lost:
            lines.append(
                _encode({"lost": batch.lost if batch.lost > 0 else None, "cpu": batch.cpu}) + "\n"
            )
        printers = self._lines
        for event in batch.events:
            line = printers.get(event.type)
            if line is None:
                line = printers[event.type] = _line_printer(event.type)
            lines.append(line(event))
        self._emit("".join(lines))

    def flush(self) -> None:
        self.stream.flush()
        self._watch.check()

    def close(self) -> None:
        self.stream.flush()

    def _emit(self, text: str) -> None:
        self.stream.write(text.encode("ascii") if self.binary else text)


_INTEGER_BASES = frozenset([f"{s}{b}" for s in "usx" for b in (8, 16, 32, 64)] + ["symbol"])


def _value_expression(arg_type: ArgType, value: str) -> tuple[str, str]:
    """The %-conversion and expression that print one argument as JSON."""
    if arg_type.base in _INTEGER_BASES and not arg_type.count:
        return "%d", value
    if arg_type.base in STRING_TYPES and not arg_type.count:
        return "%s", f"_string({value})"
    return "%s", f"_encode(_json_value({value}))"


def _string(value: str | None) -> str:
    return "null" if value is None else _encode(value)


def _line_printer(event_type: EventType) -> Callable[[Event], str]:
    """`line(e)` printing the JSON object of an event of this type (e is the Event tuple)."""
    head = _encode(
        {"group": event_type.group, "event": event_type.name, "kind": str(event_type.kind)}
    )[1:-1]
    template = '{"ts":%d,"cpu":%d,"pid":%d,"tid":%d,"comm":%s,' + head.replace("%", "%%")
    template += ',"ip":%d,"ret_ip":%s,"args":{'
    field = {name: f"e[{index}]" for name, index in _FIELD.items()}
    values = [
        field["timestamp_ns"],
        field["cpu"],
        field["pid"],
        field["tid"],
        f"_comm({field['comm']})",
        field["ip"],
        f"_ret({field['ret_ip']})",
    ]
    pieces = []
    for index, name, arg_type in event_type.shown_arguments():
        conversion, expression = _value_expression(arg_type, f"{field['args']}[{index}]")
        pieces.append(_encode(name).replace("%", "%%") + ":" + conversion)
        values.append(expression)
    template += ",".join(pieces) + '},"common_flags":%d,"common_preempt_count":%d}\n'
    values += [field["flags"], field["preempt_count"]]
    namespace: dict[str, Any] = {
        "_encode": _encode,
        "_json_value": _json_value,
        "_string": _string,
        "_comm": _comm_json,
        "_ret": _ret_json,
    }
    source = f"def line(e):\n    return {template!r} % ({', '.join(values)},)\n"
    exec(
        compile(source, f"<probescope jsonl {event_type.group}/{event_type.name}>", "exec"),
        namespace,
    )
    printer: Callable[[Event], str] = namespace["line"]
    return printer


@functools.lru_cache(maxsize=4096)
def _comm_json(comm: str) -> str:
    return _encode(comm)


def _ret_json(value: int | None) -> str:
    return "null" if value is None else str(value)


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
