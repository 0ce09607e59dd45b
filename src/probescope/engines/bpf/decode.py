"""Ring-buffer records to `Event`s, the same values the tracefs engine decodes from the
kernel's own records: integers for u/s/x types (bitfields already extracted), a one-character
`str` for `char`, `str` or None (`(fault)`) for strings, tuples for arrays; strings decoded as
UTF-8 with undecodable bytes kept as surrogate escapes.

The walk over a copied span of the ring is generated once per set of probes: per record one
`struct` unpack of the ring's and the engine's headers, one of the arguments (none for probes
without), their conversions, and the Event. A record the engine wrote for a probe index it
does not know is a bug and raises `RingBufferFormatError`.
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
    """Decodes spans of the ring buffer. Teach it every probe index before decoding.

    Probes whose records are laid out alike share one branch of the generated walk: a single
    `struct` unpack of the header and the arguments, the argument conversions, and the Event.
    """

    def __init__(self) -> None:
        self._routes: list[tuple[int, EventType] | None] = []
        self._layouts: dict[tuple[object, ...], int] = {}
        self._branches: list[tuple[str, str, bool, ArgsDecoder | None]] = []
        self._walk: Callable[[bytes, list[Event]], tuple[int, int]] | None = None
        self._comms: dict[bytes, str] = {}

    def add(
        self,
        index: int,
        event_type: EventType,
        *,
        is_return: bool,
        layout: RecordLayout | None = None,
        args: ArgsDecoder | None = None,
    ) -> None:
        """Records of probe `index` become Events of `event_type`, their arguments decoded
        from `layout` (the engine's own argument layout) or by `args` (any other record, e.g.
        a tracepoint's raw entry). BPF knows no irq/preempt flags: events carry 0."""
        branch: tuple[str, str, bool, ArgsDecoder | None]
        if layout is not None:
            codes, lines, names = _argument_code(layout)
            key: tuple[object, ...] = ("layout", codes, tuple(lines), names, is_return)
            branch = (codes, "\n".join(lines) + f"\nargs = ({names})", is_return, None)
        else:
            if args is None:
                raise RingBufferFormatError(f"probe index {index}: no layout and no decoder")
            key = ("custom", id(args), is_return)
            branch = ("", "", is_return, args)
        number = self._layouts.get(key)
        if number is None:
            number = self._layouts[key] = len(self._branches)
            self._branches.append(branch)
        while len(self._routes) <= index:
            self._routes.append(None)
        self._routes[index] = (number, event_type)
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
            "_routes": self._routes,
            "_peek": struct.Struct(f"<I{RINGBUF_HEADER_SIZE - 4}x" + HEADER.format[1:]).unpack_from,
            "_comms": self._comms,
            "_comm": self._comm,
            "_unknown": _unknown_index,
            "_chars": _CHARS,
        }
        branches = []
        for number, (codes, lines, is_return, custom) in enumerate(self._branches):
            ret_ip = "ret_ip" if is_return else "None"
            keyword = "if" if number == 0 else "elif"
            if custom is None and not codes:
                body = ["args = ()"]
            elif custom is None:
                namespace[f"_unpack{number}"] = struct.Struct("<" + codes).unpack_from
                unpacked = "".join(f"v{n}, " for n in range(len(codes)))  # a code a value
                body = [
                    f"{unpacked}= _unpack{number}(span, start + {HEADER_SIZE})",
                    *lines.splitlines(),
                ]
            else:
                namespace[f"_custom{number}"] = custom
                body = [f"args = _custom{number}(span, start, length)"]
            body += [
                "comm = _comms.get(raw_comm)",
                "if comm is None:",
                "    comm = _comm(raw_comm)",
                f"append(_new(_Event, (ts, cpu, tgid, tid, comm, event_type, ip, {ret_ip}, "
                "args, 0, 0)))",
            ]
            branches.append(f"        {keyword} branch == {number}:")
            branches += [f"            {line}" for line in body]
        if not branches:
            branches = ["        if False:", "            pass"]
        fast = self._fast_path(namespace)
        source = "\n".join(
            [
                "def walk(span, events):",
                "    append = events.append",
                "    pos = 0",
                "    end = len(span)",
                "    discarded = 0",
                "    view = memoryview(span)",
                f"    while end - pos >= {RINGBUF_HEADER_SIZE + HEADER_SIZE}:",
                *fast,
                "        word, ts, ip, ret_ip, tid, tgid, index, cpu, raw_comm = _peek(span, pos)",
                f"        if word & {RINGBUF_BUSY_BIT}:",
                "            break",
                f"        length = word & {~(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT) & 0xFFFFFFFF}",
                f"        start = pos + {RINGBUF_HEADER_SIZE}",
                "        following = start + ((length + 7) & ~7)",
                "        if following > end:",
                "            break",
                "        pos = following",
                f"        if word & {RINGBUF_DISCARD_BIT}:",
                "            discarded += 1",
                "            continue",
                "        try:",
                "            branch, event_type = _routes[index]",
                "        except (IndexError, TypeError):",
                "            _unknown(index, start)",
                *branches,
                "    view.release()",
                "    return pos, discarded",
            ]
        )
        exec(compile(source + "\n", "<probescope bpf ring walk>", "exec"), namespace)
        walk: Callable[[bytes, list[Event]], tuple[int, int]] = namespace["walk"]
        return walk

    def _fast_path(self, namespace: dict[str, Any]) -> list[str]:
        """When every probe's records have one fixed layout (one argument layout, no strings),
        runs of whole records are unpacked with `struct.iter_unpack`: one C-level loop over
        the span instead of an unpack call per record. A record of another length (busy,
        discarded) ends the run; the general code takes it, and the next run starts after."""
        if len(self._branches) != 1:
            return []
        codes, lines, is_return, custom = self._branches[0]
        if custom is not None or "at = start" in lines:
            return []
        length = HEADER_SIZE + struct.calcsize("<" + codes)
        step = RINGBUF_HEADER_SIZE + ((length + 7) & ~7)
        record = struct.Struct(
            f"<I{RINGBUF_HEADER_SIZE - 4}x" + HEADER.format[1:] + codes + f"{step - 8 - length}x"
        )
        assert record.size == step
        namespace["_records"] = record.iter_unpack
        unpacked = "".join(f"v{n}, " for n in range(len(codes)))
        ret_ip = "ret_ip" if is_return else "None"
        body = [
            "count = (end - pos) // " + str(step),
            "done = 0",
            "for (word, ts, ip, ret_ip, tid, tgid, index, cpu, raw_comm, "
            f"{unpacked}) in _records(view[pos:pos + count * {step}]):",
            f"    if word != {length}:",
            "        break",
            "    try:",
            "        _, event_type = _routes[index]",
            "    except (IndexError, TypeError):",
            f"        _unknown(index, pos + done * {step})",
            *("    " + line for line in lines.splitlines()),
            "    comm = _comms.get(raw_comm)",
            "    if comm is None:",
            "        comm = _comm(raw_comm)",
            f"    append(_new(_Event, (ts, cpu, tgid, tid, comm, event_type, ip, {ret_ip}, "
            "args, 0, 0)))",
            "    done += 1",
            f"pos += done * {step}",
            f"if end - pos < {RINGBUF_HEADER_SIZE + HEADER_SIZE}:",
            "    break",
        ]
        return ["        " + line for line in body]

    def _comm(self, raw: bytes) -> str:
        text = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if len(self._comms) < 4096:
            self._comms[raw] = text
        return text


def _unknown_index(index: int, start: int) -> None:
    raise RingBufferFormatError(
        f"record at offset {start} is of probe index {index}, which the decoder was not given"
    )


def _argument_code(layout: RecordLayout) -> tuple[str, list[str], str]:
    """(struct codes of the arguments after the header, lines turning the unpacked values
    `v0, v1, ...` into the arguments' Python values, the expression of the argument tuple)."""
    codes: list[str] = []
    lines: list[str] = []
    results: list[str] = []
    position = 0
    for number, slot in enumerate(layout.slots):
        arg_type = slot.arg.type
        count = arg_type.count
        elements = [f"v{position + n}" for n in range(count or 1)]
        position += len(elements)
        var = f"a{number}"
        if slot.is_string:
            codes.append("I" * len(elements))
            converted = []
            for n, element in enumerate(elements):
                name = f"{var}_{n}"
                lines += [
                    f"n = {element} >> 16",
                    f"at = start + ({element} & 0xffff)",
                    f"{name} = span[at:at + n - 1].decode('utf-8', 'surrogateescape') "
                    "if n else None",
                ]
                converted.append(name)
            elements = converted
        elif arg_type.base == "char":
            codes.append("B" * len(elements))
            elements = [f"_chars[{element}]" for element in elements]
        else:
            codes.append(_INT_CODES[(arg_type.size, arg_type.signed)] * len(elements))
        results.append(f"({', '.join(elements)},)" if count else elements[0])
    names = "".join(f"{result}, " for result in results)
    return "".join(codes), lines, names
