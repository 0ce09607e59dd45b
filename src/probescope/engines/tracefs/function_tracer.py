"""The ftrace function tracer in the session's instance: patterns into set_ftrace_filter and
set_ftrace_notrace, the stack option, the pid filter, then the tracer itself."""

from __future__ import annotations

from collections.abc import Sequence

from probescope.engines.tracefs.instance import Instance
from probescope.errors import TracefsError
from probescope.language.static_events import FunctionSpec


def start_function_tracer(
    instance: Instance,
    functions: Sequence[FunctionSpec],
    pids: Sequence[int],
    *,
    follow: bool,
    stack: bool,
) -> list[str]:
    """Filter first, then switch the instance's tracer: an empty filter would trace every
    function of the kernel for a moment. Returns notes for the session's summary."""
    notes = []
    for file_name, selected in (
        ("set_ftrace_filter", [f for f in functions if not f.exclude]),
        ("set_ftrace_notrace", [f for f in functions if f.exclude]),
    ):
        for index, spec in enumerate(selected):
            if index == 0:
                instance.write(file_name, spec.pattern)
            else:
                instance.append(file_name, spec.pattern)
    if stack:
        instance.set_option("func_stack_trace", True)
    if any(f.traces_everything or f.exclude for f in functions):
        notes.append("tracing (nearly) every kernel function: expect the machine to slow down")
    if pids:
        instance.set_option("function-fork", follow)
        instance.write("set_ftrace_pid", " ".join(str(p) for p in pids))
    try:
        instance.write("current_tracer", "function")
    except TracefsError as error:
        raise TracefsError(
            f"the kernel refused the function tracer: {error.message}",
            hint="this kernel forbids ftrace function tracing here",
            path=error.path,
        ) from None
    return notes
