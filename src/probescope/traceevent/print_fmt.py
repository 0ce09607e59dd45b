"""Kernel-identical text for tracepoint records: each event's `print fmt`, compiled once.

The kernel prints a trace event in `trace` with `trace_raw_output_<event>`: the event name and
`": "`, then its TP_printk run through the kernel's vsnprintf (lib/vsprintf.c) with the helpers
of include/trace/stages/stage3_trace_output.h and kernel/trace/trace_output.c (`__print_flags`,
`__print_symbolic`, `__get_str`, ...). The event's `format` file keeps that TP_printk, after the
C preprocessor, as `print fmt:`. Evaluating it with C's integer rules and the kernel's printf
gives the same bytes, as long as it only reads the record. `compile_print_fmt` splits a print
fmt (`format.parse_print_fmt`), parses its arguments (`c_expression`), compiles them
(`expression_compiler`, `trace_output_helpers`) and lowers the printf conversions
(`printf_compiler`, `vsprintf`) into one %-template over the `Event`; it refuses at compile
time, listing every problem, what it cannot reproduce from a record: kernel functions and
variables, enum names the kernel left unresolved, `%s` of kernel pointers, hashed `%p` (the
instance's `options/hash-ptr` on), `%pS` without the kernel's symbol table. What the kernel
knows beyond the record (symbols, BTF types, printk strings, hash-ptr) comes from the
`KernelContext`.

The text sink prints a tracepoint with `tracepoint_body(..., fallback=True)` from the format
its EventType carries: a print fmt it cannot reproduce prints `NAME: <print fmt not reproduced>
field=value ...` — a rendering that cannot be mistaken for the kernel's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from probescope.errors import RingBufferFormatError
from probescope.events import Event, EventType
from probescope.traceevent.body_template import BodyTemplate, Printer
from probescope.traceevent.c_expression import CParseError, CParser
from probescope.traceevent.c_types import BASE_TYPES, INT, MASK64
from probescope.traceevent.context import KernelContext
from probescope.traceevent.format import EventFormat, parse_print_fmt
from probescope.traceevent.printf_compiler import PrintfCompiler
from probescope.traceevent.trace_output_helpers import TraceOutputCompiler
from probescope.traceevent.vsprintf import RUNTIME

NOT_REPRODUCED = "<print fmt not reproduced>"
"""Marks the fallback rendering of an event whose print fmt this module cannot reproduce."""

_ARGS = Event._fields.index("args")


class PrintFmtError(RingBufferFormatError):
    """A print fmt this module cannot reproduce; `problems` lists every construct at fault."""

    def __init__(self, label: str, problems: Sequence[str], *, print_fmt: str = "") -> None:
        listing = "; ".join(problems)
        super().__init__(
            f"print fmt of {label!r} cannot be reproduced: {listing}",
            hint="print the event with fallback=True to print its fields instead",
        )
        self.label = label
        self.problems = tuple(problems)
        self.print_fmt = print_fmt


@dataclass(frozen=True)
class CompiledPrintFmt:
    """An event's print fmt as a %-`template` filled by Python `values` over `e` (the Event as
    a tuple) with `helpers` in scope: the shape of the text sink's `BodyTemplate`."""

    event_format: EventFormat
    template: str
    values: tuple[str, ...]
    helpers: Mapping[str, Any] = field(default_factory=dict)
    may_fail: bool = False
    """Whether a record can hold what the print fmt cannot print (a buffer shorter than the
    length it prints, a kernel string not in printk_formats, a division by zero): printing
    such a record raises `RingBufferFormatError`."""
    named: bool = True
    """False for events whose kernel printer does not start with `NAME: ` (syscalls)."""

    def function(self) -> Printer:
        """The text after `NAME: ` (all of it for syscalls) as a function of the event."""
        namespace: dict[str, Any] = dict(RUNTIME)
        namespace.update(self.helpers)
        values = "".join(f"{value}, " for value in self.values)
        source = f"def render(e):\n    return {self.template!r} % ({values})\n"
        label = self.event_format.label
        exec(compile(source, f"<probescope print fmt {label}>", "exec"), namespace)
        render: Printer = namespace["render"]
        return render

    def body(self, name: str) -> BodyTemplate:
        """The whole event text, `NAME: ...`, as the text sink's `BodyTemplate`."""
        helpers: dict[str, Any] = dict(RUNTIME)
        helpers.update(self.helpers)
        prefix = name.replace("%", "%%") + ": " if self.named else ""
        return BodyTemplate(prefix + self.template, self.values, helpers)


def compile_print_fmt(
    event_format: EventFormat,
    event_type: EventType | None = None,
    context: KernelContext | None = None,
) -> CompiledPrintFmt:
    """Compile `event_format.print_fmt` for Events of `event_type`, whose `args` hold the
    format's fields by name (default: all fields in format order, as `EventDecoder` gives
    them). Raises `PrintFmtError` listing every construct that cannot be reproduced."""
    context = context or KernelContext()
    arg_names = (
        event_type.arg_names if event_type is not None else [f.name for f in event_format.fields]
    )
    if event_format.system == "syscalls":
        return _compile_syscall(event_format, arg_names)
    compiler = TraceOutputCompiler(event_format, arg_names, context)
    label = event_format.label
    if not event_format.print_fmt:
        raise PrintFmtError(label, ["the format has no print fmt"])
    try:
        parts = parse_print_fmt(event_format.print_fmt, compiled=True)
    except RingBufferFormatError as error:
        raise PrintFmtError(
            label, [f"cannot parse it: {error.message}"], print_fmt=event_format.print_fmt
        ) from None
    typedefs = dict(BASE_TYPES)
    if context.types is not None:
        typedefs.update((name, INT) for name in context.types.typedefs)
    try:
        args = CParser(parts.arguments, typedefs).parse_arguments()
    except CParseError as error:
        where = error.position + parts.arguments_offset
        snippet = event_format.print_fmt.strip()[max(where - 20, 0) : where + 20]
        raise PrintFmtError(
            label,
            [f"cannot parse {error} at column {where + 1}: ...{snippet}..."],
            print_fmt=event_format.print_fmt,
        ) from None
    printf = PrintfCompiler(compiler, args)
    printf.run(parts.format)
    if compiler.problems:
        raise PrintFmtError(label, compiler.problems, print_fmt=event_format.print_fmt)
    return CompiledPrintFmt(
        event_format,
        printf.template.text,
        tuple(printf.template.values),
        compiler.helpers,
        compiler.may_fail,
    )


def _compile_syscall(event_format: EventFormat, arg_names: Sequence[str]) -> CompiledPrintFmt:
    """`print_syscall_enter`/`print_syscall_exit` (kernel/trace/trace_syscalls.c), which `trace`
    uses instead of the print fmt: `sys_NAME(arg: VALUE, ...)` with values under 10 in decimal
    and the others as `0x%lx` (Linux 6.18; older kernels printed `%lx`), and `sys_NAME -> 0x%lx`.
    Events that also record user-space strings (`__ARG_val` fields, newer kernels) are refused,
    as is the `verbose` option's output (argument types)."""
    label = event_format.label
    name = event_format.name
    fields = [f.name for f in event_format.fields]
    missing = [f for f in fields if f not in arg_names]
    if missing:
        raise PrintFmtError(label, [f"fields {missing} are not among the event's values"])
    wide = all(f.size == 8 and not f.is_dynamic for f in event_format.fields[1:])
    if not fields or fields[0] != "__syscall_nr" or not wide:
        raise PrintFmtError(
            label,
            [
                f"a syscall event with fields {fields} (newer kernels add user-space strings "
                "that `trace` prints its own way)"
            ],
        )
    values = [f"(e[{_ARGS}][{arg_names.index(f)}] & {MASK64:#x})" for f in fields[1:]]
    call = "sys_" + name.split("_", 2)[-1]
    if name.startswith("sys_enter_"):
        arguments = ", ".join(field.replace("%", "%%") + ": %s" for field in fields[1:])
        template = call.replace("%", "%%") + "(" + arguments + ")"
        values = [f"_pf_syscall_argument{value}" for value in values]
        return CompiledPrintFmt(event_format, template, tuple(values), named=False)
    if name.startswith("sys_exit_") and fields[1:] == ["ret"]:
        template = call.replace("%", "%%") + " -> 0x%x"
        return CompiledPrintFmt(event_format, template, tuple(values), named=False)
    raise PrintFmtError(label, [f"a syscall event named {name!r} with fields {fields}"])


def tracepoint_printer(
    event_type: EventType,
    event_format: EventFormat,
    context: KernelContext | None = None,
    *,
    fallback: bool = False,
) -> Printer:
    """The whole event text as `trace` prints it: `NAME: ` and the evaluated print fmt.

    With `fallback`, a print fmt that cannot be reproduced, or a record it cannot print (see
    `CompiledPrintFmt.may_fail`), gives `NAME: <print fmt not reproduced> FIELD=VALUE ...`
    instead of raising `PrintFmtError`/`RingBufferFormatError`.
    """
    body = tracepoint_body(event_type, event_format, context, fallback=fallback)
    return body.compile(event_format.label) if isinstance(body, BodyTemplate) else body


def tracepoint_body(
    event_type: EventType,
    event_format: EventFormat,
    context: KernelContext | None = None,
    *,
    fallback: bool = False,
) -> BodyTemplate | Printer:
    """`tracepoint_printer`'s text as the text sink takes it: a `BodyTemplate` when every
    record prints exactly, else a printer that falls back record by record."""
    try:
        compiled = compile_print_fmt(event_format, event_type, context)
    except PrintFmtError:
        if not fallback:
            raise
        return _fallback_printer(event_type)
    body = compiled.body(event_type.name)
    if not (fallback and compiled.may_fail):
        return body
    exact = body.compile(event_format.label)
    instead = _fallback_printer(event_type)

    def guarded(event: Event) -> str:
        try:
            return exact(event)
        except RingBufferFormatError:
            return instead(event)

    return guarded


def _fallback_printer(event_type: EventType) -> Printer:
    prefix = f"{event_type.name}: {NOT_REPRODUCED}"
    names = event_type.arg_names

    def body(event: Event) -> str:
        parts = [prefix]
        for name, value in zip(names, event.args, strict=False):
            if isinstance(value, bytes):
                value = value.hex()
            elif isinstance(value, tuple):
                value = "{" + ",".join(str(v) for v in value) + "}"
            parts.append(f"{name}={value}")
        return " ".join(parts)

    return body
