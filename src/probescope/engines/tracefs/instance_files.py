"""The files of a session's instance that a recording of its sub-buffers carries beside them
(what trace-cmd saves in a trace.dat): `header_page`, `header_event`, the `format` of every
event it decodes, `saved_cmdlines`, `saved_tgids`, `printk_formats`, `trace_clock` and each
CPU's `stats` — read while the instance exists, as text exactly as the kernel wrote it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from probescope.engines.tracefs.instance import Instance
from probescope.errors import TracefsError
from probescope.traceevent.format import EventFormat

KALLSYMS_PATH = "/proc/kallsyms"


@dataclass(frozen=True)
class InstanceFiles:
    """Text of an instance's self-descriptions; `formats` as (system, format text)."""

    header_page: str
    header_event: str
    formats: tuple[tuple[str, str], ...]
    saved_cmdlines: str = ""
    saved_tgids: str = ""
    printk_formats: str = ""
    trace_clock: str = ""
    cpu_stats: dict[int, str] = field(default_factory=dict)
    sub_buffer_size: int = 4096


def read_instance_files(instance: Instance, formats: Iterable[EventFormat]) -> InstanceFiles:
    """Read the files a recording of `instance` needs, with the format texts of `formats`."""
    texts = []
    for event_format in formats:
        system = event_format.system or "ftrace"
        texts.append((system, instance.read(f"events/{system}/{event_format.name}/format")))
    stats: dict[int, str] = {}
    for cpu in instance.cpus():
        with contextlib.suppress(TracefsError):
            stats[cpu] = instance.read(f"per_cpu/cpu{cpu}/stats")
    return InstanceFiles(
        header_page=instance.read("events/header_page"),
        header_event=instance.read("events/header_event"),
        formats=tuple(texts),
        saved_cmdlines=_optional(instance, "saved_cmdlines"),
        saved_tgids=_optional(instance, "saved_tgids"),
        printk_formats=_optional(instance, "printk_formats"),
        trace_clock=_optional(instance, "trace_clock"),
        cpu_stats=stats,
        sub_buffer_size=instance.subbuffer_size(),
    )


def _optional(instance: Instance, name: str) -> str:
    """A file that lives at the top of tracefs on some kernels and in instances on others."""
    for reader in (instance.read, _top(instance)):
        with contextlib.suppress(TracefsError, OSError, UnicodeDecodeError):
            return reader(name)
    return ""


def _top(instance: Instance) -> Callable[[str], str]:
    top = instance.root.parent.parent

    def read(name: str) -> str:
        return (top / name).read_text("utf-8", "surrogateescape")

    return read


def read_kallsyms_text(path: str = KALLSYMS_PATH) -> bytes:
    """The running kernel's /proc/kallsyms as bytes (empty when not readable)."""
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError:
        return b""
