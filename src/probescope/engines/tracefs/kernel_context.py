"""The live machine's `KernelContext`: the running kernel's symbols (/proc/kallsyms), types
(/sys/kernel/btf/vmlinux), printk strings and ring-buffer layout (tracefs), read once when a
session starts and only as far as its kinds of probes need them (a uprobe-only session reads
none: the kernel's symbols alone take a second or more to parse on a slow machine)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

from probescope.engines.tracefs.tracefs import Tracefs
from probescope.errors import EngineUnavailable, RingBufferFormatError, TracefsError
from probescope.language.model import ProbeKind
from probescope.system.kernel import RunningKernel
from probescope.traceevent.btf import KernelTypes
from probescope.traceevent.context import KernelContext
from probescope.traceevent.format import parse_header_event, parse_header_page
from probescope.traceevent.kallsyms import KernelSymbols
from probescope.traceevent.printk_formats import parse_printk_formats

KALLSYMS_PATH = "/proc/kallsyms"
BTF_PATH = "/sys/kernel/btf/vmlinux"

KINDS_NEEDING_SYMBOLS = frozenset(
    {ProbeKind.KPROBE, ProbeKind.KRETPROBE, ProbeKind.FUNCTION, ProbeKind.TRACEPOINT}
)
"""Kernel addresses are printed as symbols in kprobe and function lines and in print fmts."""


def read_kernel_symbols(path: str = KALLSYMS_PATH) -> KernelSymbols | None:
    """The running kernel's symbols, or None when they are not readable with addresses
    (not root, or kptr_restrict)."""
    try:
        return KernelSymbols.from_path(path)
    except (OSError, RingBufferFormatError):
        return None


def read_kernel_types(path: str = BTF_PATH) -> KernelTypes | None:
    """The running kernel's BTF types, or None without CONFIG_DEBUG_INFO_BTF."""
    try:
        return KernelTypes.from_path(path)
    except (OSError, RingBufferFormatError):
        return None


def read_kernel_context(
    kernel: RunningKernel,
    kinds: Collection[ProbeKind] = (),
    *,
    tracefs: Tracefs | None = None,
    hash_pointers: bool = False,
) -> KernelContext:
    """What printing events of `kinds` needs from the running kernel: its release facts always;
    its symbols for kernel probes, function-tracer events and tracepoints; its BTF types and
    printk strings for tracepoints; the ring buffer's layout when tracefs is readable.

    `hash_pointers` is whether the instance recording the events hashes `%p`; the tracefs
    engine turns `options/hash-ptr` off on Linux 6.2 and later, and on 6.1, which keeps it on,
    probescope has always printed the real pointer.
    """
    kinds = set(kinds)
    values: dict[str, Any] = {"hash_pointers": hash_pointers}
    if kinds & KINDS_NEEDING_SYMBOLS:
        values["symbols"] = read_kernel_symbols()
    if tracefs is None:
        with contextlib.suppress(EngineUnavailable):
            tracefs = Tracefs.discover(mount=False)
    if ProbeKind.TRACEPOINT in kinds:
        values["types"] = read_kernel_types()
        if tracefs is not None:
            with contextlib.suppress(OSError):
                text = (tracefs.root / "printk_formats").read_text("utf-8", "surrogateescape")
                values["strings"] = parse_printk_formats(text)
    if tracefs is not None:
        with contextlib.suppress(TracefsError, RingBufferFormatError):
            values["header_page"] = parse_header_page(tracefs.read("events/header_page"))
            values["header_event"] = parse_header_event(tracefs.read("events/header_event"))
    return KernelContext.for_release(kernel.release, **values)
