"""Recordings: trace.dat files written while tracing and read back anywhere.

`tracedat` reads trace-cmd's container (versions 6 and 7, compressed or not) and
`tracedat_writer` writes version 6; `facts` is probescope's own option inside it (probes,
event types, task names, process maps, symbols); `offline_context` builds a `KernelContext`
from a file alone; `recording.Recording` yields `EventBatch`es like an engine, so every sink
and aggregation reads a file as it reads a live session. `recorder` writes files: the tracefs
engine's raw sub-buffers as the kernel wrote them, other engines' events through `synthesis`
(formats and records made for them). `processes` samples what an offline report needs of
the traced processes.
"""
