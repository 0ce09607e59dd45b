"""A `KernelContext` built from captured files decodes and prints recorded pages exactly as the
kernel's `trace` printed them, with the live machine out of reach: opening anything under /proc
or /sys (kallsyms, BTF, tracefs) or asking the running kernel's release fails the test."""

from __future__ import annotations

import builtins
import io
import json
import lzma
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from probescope.events import Event, EventBatch
from probescope.sinks.base import open_sink
from probescope.traceevent.context import KernelContext
from probescope.traceevent.decoder import EventDecoder
from probescope.traceevent.merge import merge_cpu_batches
from probescope.traceevent.print_fmt import NOT_REPRODUCED, PrintFmtError, compile_print_fmt

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PRINT_FMT_CAPTURES = sorted(p.parent for p in (FIXTURES / "print_fmt").glob("*/meta.json"))
PAGE_CASES = sorted(p.parent for p in FIXTURES.glob("kernel-*/*/meta.json"))
LIVE = ("/proc", "/sys")


class LiveAccess(AssertionError):
    """The code under test reached for the live machine."""


@pytest.fixture
def no_live_kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every way this process opens a file refuses /proc and /sys, and the running kernel's
    release is not to be had; the test also fails if such an attempt was swallowed."""
    attempts: list[str] = []

    def guarded(opener: Callable[..., Any]) -> Callable[..., Any]:
        def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, str | bytes | os.PathLike):
                path = os.path.abspath(os.fsdecode(file))
                if any(path == live or path.startswith(live + "/") for live in LIVE):
                    attempts.append(path)
                    raise LiveAccess(f"opened {path} of the live machine")
            return opener(file, *args, **kwargs)

        return open_

    def no_release(*args: Any, **kwargs: Any) -> Any:
        attempts.append("the running kernel's release")
        raise LiveAccess("asked for the running kernel's release")

    monkeypatch.setattr(builtins, "open", guarded(builtins.open))
    monkeypatch.setattr(io, "open", guarded(io.open))
    monkeypatch.setattr(os, "open", guarded(os.open))
    monkeypatch.setattr(os, "uname", no_release)
    monkeypatch.setattr(platform, "release", no_release)
    yield attempts
    assert attempts == [], f"the live machine was read: {attempts}"


def test_the_guard_refuses_the_live_kernel(no_live_kernel: list[str]) -> None:
    with pytest.raises(LiveAccess):
        Path("/proc/kallsyms").read_text()
    with pytest.raises(LiveAccess):
        open("/sys/kernel/btf/vmlinux", "rb")  # noqa: SIM115
    assert no_live_kernel == ["/proc/kallsyms", "/sys/kernel/btf/vmlinux"]
    no_live_kernel.clear()


def decode(context: KernelContext, raw: dict[int, bytes]) -> list[Event]:
    decoder = EventDecoder.from_context(context)
    streams = [decoder.decode_all(data, cpu) for cpu, data in raw.items()]
    return [event for batch in merge_cpu_batches(streams) for event in batch.events]


def trace_body(trace: bytes) -> bytes:
    """The `trace` file without its `#` header lines."""
    return b"".join(line for line in trace.splitlines(True) if not line.startswith(b"#"))


@pytest.mark.parametrize("path", PRINT_FMT_CAPTURES, ids=[p.name for p in PRINT_FMT_CAPTURES])
def test_tracepoint_pages_print_as_the_kernel_printed_them(
    path: Path, no_live_kernel: list[str]
) -> None:
    context = KernelContext.from_directory(path)
    assert context.release == path.name
    assert context.symbols is not None and context.strings and context.formats
    raw = {
        int(packed.name[3:].split(".")[0]): lzma.decompress(packed.read_bytes())
        for packed in sorted(path.glob("cpu*.raw.xz"))
    }
    events = decode(context, raw)
    refused = set()
    for event_format in context.formats:
        try:
            compile_print_fmt(event_format, None, context)
        except PrintFmtError:
            refused.add(event_format.name)
    out = io.BytesIO()
    sink = open_sink("text", out, context=context, clock="local", irq_info=True)
    sink.write_batch(EventBatch(events))
    sink.close()
    ours = out.getvalue().splitlines(True)
    kernel = trace_body(lzma.decompress((path / "trace.xz").read_bytes())).splitlines(True)
    assert len(ours) == len(kernel) == len(events) > 30000
    same = 0
    for event, line, expected in zip(events, ours, kernel, strict=True):
        if event.name in refused:
            assert NOT_REPRODUCED.encode() in line
        else:
            assert line == expected
            same += 1
    assert same > 30000
    assert len(refused) <= 3


@pytest.mark.parametrize("path", PAGE_CASES, ids=[f"{p.parent.name}/{p.name}" for p in PAGE_CASES])
def test_probe_and_tracepoint_pages_print_byte_for_byte(
    path: Path, no_live_kernel: list[str]
) -> None:
    meta = json.loads((path / "meta.json").read_text())
    context = KernelContext.from_directory(path)
    raw = {cpu: (path / f"cpu{cpu}.raw").read_bytes() for cpu in meta["cpus"]}
    events = decode(context, raw)
    out = io.BytesIO()
    sink = open_sink(
        "text",
        out,
        context=context,
        clock=meta["clock"],
        tgids=context.tgids if meta["record_tgid"] else None,
        irq_info=meta["irq_info"],
    )
    sink.write_batch(EventBatch(events))
    assert events
    assert out.getvalue() == trace_body((path / "trace").read_bytes())
