"""Ring-buffer records to `Event`s, the same values the tracefs engine decodes from the
kernel's own records: integers for u/s/x types (bitfields already extracted), a one-character
`str` for `char`, `str` or None (`(fault)`) for strings, tuples for arrays; strings decoded as
UTF-8 with undecodable bytes kept as surrogate escapes.

Each probe gets, once, a `struct` layout and a few generated lines for its arguments; the walk
over a copied span of the ring is generated too, so a record costs a header unpack, a list
index and a tuple. A record the engine wrote for a probe index it does not know is a bug and
raises `RingBufferFormatError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probescope.engines.bpf.abi import RINGBUF_BUSY_BIT, RINGBUF_DISCARD_BIT, RINGBUF_HEADER_SIZE
from probescope.engines.bpf.record import HEADER, HEADER_SIZE, RecordLayout
from probescope.errors import RingBufferFormatError
from probescope.events import Event, EventType

_CHARS = tuple(bytes([b]).decode("utf-8", "surrogateescape") for b in range(256))
_INT_CODES = {(1, False): "B", (2, False): "H", (4, False): "I", (8, False): "Q"}
_INT_CODES.update({(size, True): code.lower() for (size, _), code in list(_INT_CODES.items())})

ArgsDecoder = Callable[[bytes, int, int], tuple[Any, ...]]
"""(span, record start, record length) → the argument values."""


@dataclass(frozen=True)
class Walked:
    events: list[Event]
    consumed: int  # bytes of whole records walked (give them back to the ring)
    discarded: int  # records programs discarded (filtered out)


class RecordDecoder:
    """Decodes spans of the ring buffer. Teach it every probe index before decoding."""

    def __init__(self) -> None:
        self._entries: list[tuple[EventType, bool, ArgsDecoder | None] | None] = []
        self._walk: Callable[[bytes, list[Event]], tuple[int, int]] | None = None
        self._comms: dict[bytes, str] = {}

    def add(
        self,
        index: int,
        event_type: EventType,
        *,
        is_return: bool,
        args: ArgsDecoder | None,
    ) -> None:
        """Records of probe `index` become Events of `event_type`; `args` decodes the bytes
        after the header (None: the probe has no arguments). BPF knows no irq/preempt flags:
        events carry 0."""
        while len(self._entries) <= index:
            self._entries.append(None)
        self._entries[index] = (event_type, is_return, args)
        self._walk = None

    def walk(self, span: bytes) -> Walked:
        if self._walk is None:
            self._walk = self._compile()
        events: list[Event] = []
        try:
            consumed, discarded = self._walk(span, events)
        except (struct.error, IndexError, TypeError) as error:
            raise RingBufferFormatError(f"malformed ring-buffer record: {error}") from None
        return Walked(events, consumed, discarded)

    def _compile(self) -> Callable[[bytes, list[Event]], tuple[int, int]]:
        namespace: dict[str, Any] = {
            "_new": tuple.__new__,
            "_Event": Event,
            "_entries": self._entries,
            "_head": HEADER.unpack_from,
            "_u32": struct.Struct("<I").unpack_from,
            "_comms": self._comms,
            "_comm": self._comm,
            "_unknown": _unknown_index,
        }
        source = f"""
def walk(span, events):
    append = events.append
    pos = 0
    end = len(span)
    discarded = 0
    while end - pos >= {RINGBUF_HEADER_SIZE}:
        word = _u32(span, pos)[0]
        if word & {RINGBUF_BUSY_BIT}:
            break
        length = word & {~(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT) & 0xFFFFFFFF}
        start = pos + {RINGBUF_HEADER_SIZE}
        following = start + ((length + 7) & ~7)
        if following > end:
            break
        pos = following
        if word & {RINGBUF_DISCARD_BIT}:
            discarded += 1
            continue
        ts, ip, ret_ip, tid, tgid, index, cpu, raw_comm = _head(span, start)
        comm = _comms.get(raw_comm)
        if comm is None:
            comm = _comm(raw_comm)
        try:
            event_type, is_return, args = _entries[index]
        except (IndexError, TypeError):
            _unknown(index, start)
        append(_new(_Event, (
            ts, cpu, tgid, tid, comm, event_type, ip,
            ret_ip if is_return else None,
            () if args is None else args(span, start, length),
            0, 0,
        )))
    return pos, discarded
"""
        exec(compile(source, "<probescope bpf ring walk>", "exec"), namespace)
        walk: Callable[[bytes, list[Event]], tuple[int, int]] = namespace["walk"]
        return walk

    def _comm(self, raw: bytes) -> str:
        text = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if len(self._comms) < 4096:
            self._comms[raw] = text
        return text


def _unknown_index(index: int, start: int) -> None:
    raise RingBufferFormatError(
        f"record at offset {start} is of probe index {index}, which the decoder was not given"
    )


def compile_args_decoder(layout: RecordLayout, label: str) -> ArgsDecoder | None:
    """The function that decodes a probe's arguments from its record (None: no arguments)."""
    if not layout.slots:
        return None
    codes = ["<", f"{HEADER_SIZE}x"]
    names: list[str] = []
    lines: list[str] = []
    results: list[str] = []
    for number, slot in enumerate(layout.slots):
        arg_type = slot.arg.type
        count = arg_type.count
        var = f"a{number}"
        elements = [f"{var}_{n}" for n in range(count)] if count else [var]
        names += elements
        if slot.is_string:
            codes.append("I" * len(elements))
            for element in elements:
                lines += [
                    f"n = {element} >> 16",
                    f"at = start + ({element} & 0xffff)",
                    f"{element} = span[at:at + n - 1].decode('utf-8', 'surrogateescape') "
                    "if n else None",
                ]
        elif arg_type.base == "char":
            codes.append("B" * len(elements))
            lines += [f"{element} = _chars[{element}]" for element in elements]
        else:
            codes.append(_INT_CODES[(arg_type.size, arg_type.signed)] * len(elements))
        results.append(f"({', '.join(elements)},)" if count else var)
    unpack = struct.Struct("".join(codes)).unpack_from
    body = [
        "def args(span, start, length):",
        f"    {', '.join(names)}, = _unpack(span, start)",
        *("    " + line for line in lines),
        f"    return ({', '.join(results)},)",
    ]
    namespace: dict[str, Any] = {"_unpack": unpack, "_chars": _CHARS}
    exec(compile("\n".join(body) + "\n", f"<probescope bpf args {label}>", "exec"), namespace)
    decoder: ArgsDecoder = namespace["args"]
    return decoder
