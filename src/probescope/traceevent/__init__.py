"""The trace-event layer (libtraceevent's analogue): what the kernel's tracing writes, read.

Event `format` files and the ring buffer's self-description (`format`), sub-buffers of the ring
buffer (`ringbuffer`), records decoded into `Event`s (`decoder`, `event_layout`) and merged
across CPUs (`merge`), the kernel's symbols, types and strings, and `print fmt` evaluated as the
kernel's `trace` prints it. Everything here reads values it is given (a `KernelContext`, bytes,
text) and never the live machine, so a recording decodes and prints on another machine.
Importable by engines and sinks alike; it imports neither.
"""
