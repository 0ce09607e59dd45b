"""The trace-event layer (libtraceevent's analogue): what the kernel's tracing writes, read.

`context.KernelContext` holds what a kernel knows beyond its records, as one value: event
`format` files and the ring buffer's self-description (`format`), the kernel's symbols
(`kallsyms`), types (`btf`) and strings (`printk_formats`). From it and raw bytes:
sub-buffers are walked (`ringbuffer`), records decoded into `Event`s (`event_layout`,
`decoder`) and merged across CPUs in the order `trace` prints them (`merge`); a tracepoint's
`print fmt` is evaluated as the kernel prints it (`print_fmt`, built from `c_expression`,
`c_types`, `expression_compiler`, `trace_output_helpers`, `printf_compiler`, `vsprintf`, and
handing its text on as a `body_template.BodyTemplate`). Nothing here reads the live machine,
so a recording decodes and prints on another machine. Importable by engines and sinks alike;
it imports neither (only language/, errors and events).
"""
