"""Text output identical to the kernel's `trace` file.

A line is the context the kernel prints (`trace_print_context` in kernel/trace/trace_output.c):
`"%16s-%-7d "` comm and thread id, `"(%7d) "` tgid when `options/record-tgid` is on,
`"[%03d] "` cpu, five latency flag characters (`trace_print_lat_fmt`) and the timestamp
(`" %5lu.%06lu: "` in microseconds rounded like the kernel's `ns2usecs`, or `" %12llu: "` for
counter clocks), followed by the event's own text. Probe events are printed as
`print_uprobe_event` (kernel/trace/trace_uprobe.c) does, with the argument printers of
kernel/trace/trace_probe.c. Other kinds get a printer from `EVENT_PRINTERS`: tracepoints
their `print fmt` evaluated (`traceevent.print_fmt`), kprobes and the function tracer their
kernel symbols. What the kernel knows beyond the records (its symbols, types, strings, the flag
letters of its release) comes from the `KernelContext` the sink is given; the sink reads nothing
of the machine it runs on.

For byte-identical output give the sink a binary stream: strings are written back with the bytes
the kernel recorded (see `traceevent.decoder`), which a strict text stream may refuse.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import IO, Any

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import STRING_TYPES, ArgType, ProbeKind
from probescope.sinks.base import OutputFormat, StreamWatch, is_binary_stream
from probescope.traceevent.body_template import BodyTemplate, Printer
from probescope.traceevent.context import KernelContext

TRACE_FLAG_IRQS_OFF = 0x01
TRACE_FLAG_NEED_RESCHED_LAZY = 0x02
TRACE_FLAG_IRQS_NOSUPPORT = 0x02
TRACE_FLAG_NEED_RESCHED = 0x04
TRACE_FLAG_HARDIRQ = 0x08
TRACE_FLAG_SOFTIRQ = 0x10
TRACE_FLAG_PREEMPT_RESCHED = 0x20
TRACE_FLAG_NMI = 0x40
TRACE_FLAG_BH_OFF = 0x80

COUNTER_CLOCKS = frozenset({"counter", "uptime", "x86-tsc"})
"""`trace_clock` values whose timestamps are not nanoseconds (printed as raw counts)."""

FAULT_STRING = "(fault)"

_TIMESTAMP = Event._fields.index("timestamp_ns")
_CPU = Event._fields.index("cpu")
_TID = Event._fields.index("tid")
_COMM = Event._fields.index("comm")
_IP = Event._fields.index("ip")
_RET_IP = Event._fields.index("ret_ip")
_ARGS = Event._fields.index("args")
_FLAGS = Event._fields.index("flags")
_PREEMPT_COUNT = Event._fields.index("preempt_count")


def lat_flags(
    flags: int, preempt_count: int, *, lazy_resched: bool = True, irqflags_support: bool = True
) -> str:
    """The five flag characters `trace_print_lat_fmt` prints for `common_flags` and
    `common_preempt_count`.

    `lazy_resched` selects the flag layout of Linux 6.13 and later, where bit 1 is
    NEED_RESCHED_LAZY (need-resched column `B`, `L`, `b`, `l`); before, bit 1 was
    IRQS_NOSUPPORT (`X`). `irqflags_support=False` is a kernel built without
    CONFIG_TRACE_IRQFLAGS_SUPPORT, which prints `X` where no irq flag is set.
    """
    bh_off = flags & TRACE_FLAG_BH_OFF
    if flags & TRACE_FLAG_IRQS_OFF:
        irqs_off = "D" if bh_off else "d"
    elif bh_off:
        irqs_off = "b"
    elif not irqflags_support or (not lazy_resched and flags & TRACE_FLAG_IRQS_NOSUPPORT):
        irqs_off = "X"
    else:
        irqs_off = "."

    need = flags & TRACE_FLAG_NEED_RESCHED
    preempt = flags & TRACE_FLAG_PREEMPT_RESCHED
    lazy = flags & TRACE_FLAG_NEED_RESCHED_LAZY if lazy_resched else 0
    if need and lazy and preempt:
        need_resched = "B"
    elif need and preempt:
        need_resched = "N"
    elif lazy and preempt:
        need_resched = "L"
    elif need and lazy:
        need_resched = "b"
    elif need:
        need_resched = "n"
    elif preempt:
        need_resched = "p"
    elif lazy:
        need_resched = "l"
    else:
        need_resched = "."

    nmi = flags & TRACE_FLAG_NMI
    hardirq = flags & TRACE_FLAG_HARDIRQ
    softirq = flags & TRACE_FLAG_SOFTIRQ
    if nmi:
        hardsoft = "Z" if hardirq else "z"
    elif hardirq:
        hardsoft = "H" if softirq else "h"
    else:
        hardsoft = "s" if softirq else "."

    depth = f"{preempt_count & 0xF:x}" if preempt_count & 0xF else "."
    migrate = f"{preempt_count >> 4:x}" if preempt_count & 0xF0 else "."
    return irqs_off + need_resched + hardsoft + depth + migrate


def lost_line(cpu: int | None, lost: int) -> str:
    """The line `trace_pipe` prints before events that follow a loss (negative: unknown count)."""
    where = "?" if cpu is None else str(cpu)
    if lost < 0:
        return f"CPU:{where} [LOST EVENTS]\n"
    return f"CPU:{where} [LOST {lost} EVENTS]\n"


PrinterFactory = Callable[[EventType, KernelContext], BodyTemplate | Printer]
"""Makes the text of one event type, given what the kernel that wrote its events knew."""


class TextSink:
    """Writes one kernel-format line per event.

    `context` is what the kernel that wrote the events knew (symbols for kprobe and function
    lines and `%pS`, BTF types and printk strings for print fmts, the flag letters of its
    release); without one, a minimal context: addresses print as numbers. `clock` is the
    instance's `trace_clock` (picks the timestamp format); `tgids` (tid → tgid, from
    `saved_tgids`) turns on the `options/record-tgid` column, printed `(-------)` for a tid the
    map lacks, as the kernel does; `irq_info=False` drops the flag column like
    `options/irq-info` off; `lost_lines` writes `CPU:N [LOST M EVENTS]` before a batch that
    follows a loss, as `trace_pipe` does.
    """

    def __init__(
        self,
        stream: IO[Any],
        *,
        context: KernelContext | None = None,
        clock: str = "local",
        tgids: Mapping[int, int] | None = None,
        irq_info: bool = True,
        lost_lines: bool = True,
        binary: bool | None = None,
    ) -> None:
        self.stream = stream
        self._watch = StreamWatch(stream)
        self.kernel = context or KernelContext()
        self.binary = is_binary_stream(stream) if binary is None else binary
        self.lost_lines = lost_lines
        self._lines: dict[EventType, Printer] = {}
        self._context = _LineContext(
            self.kernel,
            in_ns=clock not in COUNTER_CLOCKS,
            tgids=tgids,
            irq_info=irq_info,
        )

    def format(self, event: Event) -> str:
        """The line (with its newline) for one event."""
        line = self._lines.get(event.type)
        if line is None:
            line = self._lines[event.type] = self._context.line_printer(event.type)
        return line(event)

    def write(self, event: Event) -> None:
        self._emit(self.format(event))

    def write_batch(self, batch: EventBatch) -> None:
        parts = []
        if batch.lost and self.lost_lines:
            parts.append(lost_line(batch.cpu, batch.lost))
        lines = self._lines
        for event in batch.events:
            line = lines.get(event.type)
            if line is None:
                line = lines[event.type] = self._context.line_printer(event.type)
            parts.append(line(event))
        self._emit("".join(parts))

    def context_columns(self, tid: int, comm: str) -> str:
        """The task columns a line of thread `tid` starts with: `comm-tid `, and the tgid
        column when it is on (for the report accelerator, `sinks/text_program.py`)."""
        text = f"{comm:>16}-{tid:<7d} "
        if self._context.tgids is not None:
            text += self._context._tgid_column(tid)
        return text

    def flag_column(self, flags: int, preempt_count: int) -> str:
        """The five flag letters (empty with `irq_info` off)."""
        if not self._context.irq_info:
            return ""
        text: str = self._context.namespace["_lat"][(flags << 8) | preempt_count]
        return text

    @property
    def in_ns(self) -> bool:
        """Whether timestamps print as seconds.microseconds (else as raw counts)."""
        return self._context.in_ns

    @property
    def irq_info(self) -> bool:
        return self._context.irq_info

    def flush(self) -> None:
        self.stream.flush()
        self._watch.check()

    def close(self) -> None:
        self.stream.flush()

    def _emit(self, text: str) -> None:
        if self.binary:
            self.stream.write(text.encode("utf-8", "surrogateescape"))
        else:
            self.stream.write(text)


class _LatFlags(dict[int, str]):
    """Flag strings by `flags << 8 | preempt_count`, computed once each."""

    def __init__(self, lazy_resched: bool, irqflags_support: bool) -> None:
        super().__init__()
        self.lazy_resched = lazy_resched
        self.irqflags_support = irqflags_support

    def __missing__(self, key: int) -> str:
        text = lat_flags(
            key >> 8,
            key & 0xFF,
            lazy_resched=self.lazy_resched,
            irqflags_support=self.irqflags_support,
        )
        self[key] = text
        return text


class _CpuColumns(dict[int, str]):
    def __missing__(self, cpu: int) -> str:
        text = self[cpu] = f"[{cpu:03d}] "
        return text


class _LineContext:
    """`trace_print_context`, compiled together with each event type's text into one function.

    The `"%16s-%-7d "` task column is cached per thread id (and re-made when its comm
    changes); the tgid column, when on, is looked up for every line as the kernel does.
    """

    def __init__(
        self,
        kernel: KernelContext,
        *,
        in_ns: bool,
        tgids: Mapping[int, int] | None,
        irq_info: bool,
    ) -> None:
        self.kernel = kernel
        self.in_ns = in_ns
        self.tgids = tgids
        self.irq_info = irq_info
        self.namespace: dict[str, Any] = {
            "_heads": {},
            "_head": self._head,
            "_cpus": _CpuColumns(),
            "_lat": _LatFlags(kernel.lazy_resched, kernel.irqflags_support),
            "_tgid_column": self._tgid_column,
            "_second": [0, "     0."],
            "_next_second": self._next_second,
        }

    def _head(self, tid: int, comm: str) -> tuple[str, str]:
        head = (comm, f"{comm:>16}-{tid:<7d} ")
        self.namespace["_heads"][tid] = head
        return head

    def _next_second(self, micros: int) -> int:
        """Move the cached `" %5lu."` seconds text to the second holding `micros` (the time in
        microseconds, rounded like the kernel's ns2usecs); return the microseconds within it."""
        seconds, within = divmod(micros, 1000000)
        second = self.namespace["_second"]
        second[0] = seconds * 1000000
        second[1] = f" {seconds:5d}."
        return within

    def _tgid_column(self, tid: int) -> str:
        tgid = self.tgids.get(tid) if self.tgids is not None else None
        return f"({tgid:7d}) " if tgid else "(-------) "

    def line_printer(self, event_type: EventType) -> Printer:
        factory = EVENT_PRINTERS.get(event_type.kind, field_printer)
        body = factory(event_type, self.kernel)
        namespace = dict(self.namespace)
        if isinstance(body, BodyTemplate):
            namespace.update(body.helpers)
            template, values = body.template + "\n", list(body.values)
        else:
            namespace["_body"] = body
            template, values = "%s\n", ["_body(e)"]
        prefix = ["head[1]"]
        if self.tgids is not None:
            prefix.append(f"_tgid_column(e[{_TID}])")
        prefix.append(f"_cpus[e[{_CPU}]]")
        if self.irq_info:
            prefix.append(f"_lat[(e[{_FLAGS}] << 8) | e[{_PREEMPT_COUNT}]]")
        lines = [
            "def line(e):",
            f"    head = _heads.get(e[{_TID}])",
            f"    if head is None or head[0] != e[{_COMM}]:",
            f"        head = _head(e[{_TID}], e[{_COMM}])",
        ]
        if self.in_ns:
            lines += [
                f"    micros = (e[{_TIMESTAMP}] + 500) // 1000 - _second[0]",
                "    if not 0 <= micros < 1000000:",
                "        micros = _next_second(micros + _second[0])",
            ]
            prefix.append("_second[1]")
            template = "%06d: " + template
            values = ["micros", *values]
        else:
            template = " %12d: " + template
            values = [f"e[{_TIMESTAMP}]", *values]
        lines.append(f"    return {' + '.join(prefix)} + {template!r} % ({_tuple(values)})")
        filename = f"<probescope text line {event_type.group}/{event_type.name}>"
        exec(compile("\n".join(lines) + "\n", filename, "exec"), namespace)
        printer: Printer = namespace["line"]
        return printer


def _tuple(values: list[str] | tuple[str, ...]) -> str:
    return "".join(f"{value}, " for value in values)


def probe_printer(event_type: EventType, context: KernelContext) -> BodyTemplate:
    """`print_uprobe_event`: `NAME: (0x%lx)` for entries, `NAME: (0x%lx <- 0x%lx)` (return
    address, function) for returns, then ` ARG=VALUE` per argument."""
    name = event_type.name.replace("%", "%%")
    if event_type.kind.is_return:
        template = f"{name}: (0x%x <- 0x%x)"
        values = [f"e[{_RET_IP}]", f"e[{_IP}]"]
    else:
        template = f"{name}: (0x%x)"
        values = [f"e[{_IP}]"]
    arg_template, arg_values, helpers = _arguments(event_type, context)
    return BodyTemplate(template + arg_template, (*values, *arg_values), helpers)


def field_printer(event_type: EventType, context: KernelContext) -> BodyTemplate:
    """`NAME: field=value ...` for kinds without a kernel-identical printer (tracepoints whose
    type carries no format). Not the kernel's text."""
    arg_template, arg_values, helpers = _arguments(event_type, context)
    return BodyTemplate(
        f"{event_type.name.replace('%', '%%')}:" + arg_template, arg_values, helpers
    )


def _arguments(
    event_type: EventType, context: KernelContext
) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """` ARG=VALUE` per argument as trace_probe.c prints them: template, values, helpers."""
    template = ""
    values: list[str] = []
    for index, arg_name, arg_type in event_type.shown_arguments():
        conversion, expression = _arg_printer(arg_type, f"e[{_ARGS}][{index}]")
        template += f" {arg_name.replace('%', '%%')}={conversion}"
        values.append(expression)
    return template, tuple(values), _value_helpers(context)


def _arg_printer(arg_type: ArgType, value: str) -> tuple[str, str]:
    """The %-conversion and the expression that print one argument like trace_probe.c."""
    base = arg_type.base
    if base in STRING_TYPES:
        if arg_type.count:
            return "{%s}", f"_strings({value})"
        return "%s", f"_string({value})"
    if base == "char":
        if arg_type.count:
            return "{%s}", f"_chars({value})"
        return "'%s'", value
    if base == "bytes":
        return "%s", f"_bytes({value})"
    if base == "symbol":
        if arg_type.count:
            return "{%s}", f"_ksyms({value})"
        return "%s", f"_ksym({value})"
    hexadecimal = base.startswith("x")
    if arg_type.count:
        return "{%s}", f"{'_hexes' if hexadecimal else '_ints'}({value})"
    return ("0x%x" if hexadecimal else "%d"), value


def _string(value: str | None) -> str:
    return FAULT_STRING if value is None else f'"{value}"'


def _strings(values: tuple[str | None, ...]) -> str:
    return ",".join([FAULT_STRING if v is None else f'"{v}"' for v in values])


def _chars(values: tuple[str, ...]) -> str:
    return ",".join([f"'{v}'" for v in values])


def _ints(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values))


def _hexes(values: tuple[int, ...]) -> str:
    return ",".join([f"0x{v:x}" for v in values])


def _bytes(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.hex()


def _value_helpers(context: KernelContext) -> dict[str, Any]:
    ksym = context.print_symbol

    def ksyms(values: tuple[int, ...]) -> str:
        return ",".join(map(ksym, values))

    return {
        "_ksym": ksym,
        "_ksyms": ksyms,
        "_string": _string,
        "_strings": _strings,
        "_chars": _chars,
        "_ints": _ints,
        "_hexes": _hexes,
        "_bytes": _bytes,
    }


def kprobe_printer(event_type: EventType, context: KernelContext) -> Printer:
    """`print_kprobe_event`/`print_kretprobe_event`: `NAME: (sym+0xoff/0xsize)` or
    `NAME: (caller+0xoff/0xsize <- func)`, then the arguments as for uprobes."""
    tail = BodyTemplate(*_arguments(event_type, context)).compile(event_type.name)
    name = event_type.name
    symbol = context.print_symbol
    if event_type.kind.is_return:

        def returned(e: Event) -> str:
            caller = symbol(e.ret_ip or 0)
            return f"{name}: ({caller} <- {symbol(e.ip, offset=False)}){tail(e)}"

        return returned

    def entered(e: Event) -> str:
        return f"{name}: ({symbol(e.ip)}){tail(e)}"

    return entered


def function_printer(event_type: EventType, context: KernelContext) -> BodyTemplate | Printer:
    """`trace_fn_trace`: `func <-parent` (no event name), symbols as `%ps`; a kernel_stack
    record (func_stack_trace) as `trace_stack_print` does: `<stack trace>` then ` => caller`
    lines up to the end of the record or ULONG_MAX; a user_stack record (userstacktrace) as
    `trace_user_stack_print` does without sym-userobj: `<user stack trace>` then
    ` =>  <%016lx>` lines up to the first zero."""
    if event_type.name == "kernel_stack":
        return _StackLines(context)
    if event_type.name == "user_stack":
        return _user_stack_lines
    user_calls = getattr(event_type.format, "call_text", None)
    if user_calls is not None:  # the user-space function tracer: the program's own symbols
        return user_calls  # type: ignore[no-any-return]
    return BodyTemplate(
        "%s", (f"_calls[e[{_ARGS}][0], e[{_ARGS}][1]]",), {"_calls": _CallText(context)}
    )


class _CallText(dict[tuple[int, int], str]):
    """`func <-parent` by (ip, parent ip): a traced function set has few call sites."""

    def __init__(self, context: KernelContext) -> None:
        super().__init__()
        self.symbol = context.print_symbol

    def __missing__(self, key: tuple[int, int]) -> str:
        ip, parent = key
        text = self.symbol(ip, offset=False) if ip else "0"
        if parent:
            text += " <-" + self.symbol(parent, offset=False)
        if len(self) < 65536:
            self[key] = text
        return text


def print_fmt_printer(event_type: EventType, context: KernelContext) -> BodyTemplate | Printer:
    """A tracepoint's text: its `print fmt` evaluated as `trace` does when its type carries its
    format (record by record falling back to `NAME: <print fmt not reproduced> field=value`),
    else `field_printer`."""
    if event_type.format is None:
        return field_printer(event_type, context)
    # Imported here: the print fmt compiler costs tens of milliseconds of start-up that sessions
    # without tracepoints do not need.
    from probescope.traceevent.print_fmt import tracepoint_body

    return tracepoint_body(event_type, event_type.format, context, fallback=True)


FTRACE_TRAMPOLINE_MARKER = 0x7FFFFFFF
_ULONG_MAX = (1 << 64) - 1


class _StackLines:
    """A kernel_stack record as `trace_stack_print` prints it."""

    def __init__(self, context: KernelContext) -> None:
        self.symbol = context.print_symbol

    def __call__(self, e: Event) -> str:
        raw = e.args[-1]
        lines = ["<stack trace>"]
        for (address,) in struct.iter_unpack("<Q", raw[: len(raw) // 8 * 8]):
            if address == _ULONG_MAX:
                break
            if address == FTRACE_TRAMPOLINE_MARKER:
                lines.append(" => [FTRACE TRAMPOLINE]")
            else:
                lines.append(" => " + (self.symbol(address, offset=False) if address else "0"))
        return "\n".join(lines)


def _user_stack_lines(e: Event) -> str:
    raw = e.args[-1]
    lines = ["<user stack trace>"]
    for (address,) in struct.iter_unpack("<Q", raw[: len(raw) // 8 * 8]):
        if not address:
            break
        lines.append(f" =>  <{address:016x}>")
    return "\n".join(lines)


EVENT_PRINTERS: dict[ProbeKind, PrinterFactory] = {
    ProbeKind.KPROBE: kprobe_printer,
    ProbeKind.KRETPROBE: kprobe_printer,
    ProbeKind.FUNCTION: function_printer,
    ProbeKind.UPROBE: probe_printer,
    ProbeKind.URETPROBE: probe_printer,
    ProbeKind.USDT: probe_printer,
    ProbeKind.TRACEPOINT: print_fmt_printer,
}
"""The event-text printer per kind; kinds not listed use `field_printer`."""

TEXT_FORMAT = OutputFormat(
    name="text",
    description="one line per event, as the kernel's trace file prints it",
    factory=TextSink,
)
