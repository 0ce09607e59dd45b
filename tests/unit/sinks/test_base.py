"""The output-format registry and stream detection."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from probescope.events import Event, EventBatch
from probescope.sinks import base
from probescope.sinks.base import (
    OutputFormat,
    OutputFormatError,
    is_binary_stream,
    open_sink,
    output_format,
    output_formats,
    register_format,
)
from probescope.sinks.jsonl import JsonLinesSink
from probescope.sinks.text import TextSink
from probescope.traceevent.context import KernelContext


def test_builtin_formats() -> None:
    assert {"text", "jsonl"} <= set(output_formats())
    assert output_format("text").factory is TextSink
    assert output_format("jsonl").factory is JsonLinesSink
    assert isinstance(open_sink("text", io.StringIO(), clock="mono"), TextSink)


def test_sinks_are_given_the_kernel_context() -> None:
    context = KernelContext.for_release("6.1.0-56-amd64")
    text = open_sink("text", io.StringIO(), context=context)
    jsonl = open_sink("jsonl", io.StringIO(), context=context)
    assert isinstance(text, TextSink) and text.kernel is context
    assert isinstance(jsonl, JsonLinesSink) and jsonl.kernel is context
    assert isinstance(open_sink("text", io.StringIO()), TextSink)


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(OutputFormatError, match="unknown output format 'xml'") as raised:
        output_format("xml")
    assert raised.value.hint is not None
    assert "jsonl, parquet, perfetto, text" in raised.value.hint


def test_bad_option_is_an_output_format_error() -> None:
    with pytest.raises(OutputFormatError, match="output format 'jsonl'"):
        open_sink("jsonl", io.StringIO(), colour=True)


def test_register_a_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_REGISTERED", dict(base._REGISTERED))

    class Counter:
        def __init__(self, stream: io.StringIO, context: KernelContext) -> None:
            self.count = 0

        def write(self, event: Event) -> None:
            self.count += 1

        def write_batch(self, batch: EventBatch) -> None:
            self.count += len(batch)

        def close(self) -> None:
            pass

    register_format(OutputFormat("count", "counts events", Counter))
    assert "count" in output_formats()
    assert isinstance(open_sink("count", io.StringIO()), Counter)


def test_binary_stream_detection(tmp_path: Path) -> None:
    assert is_binary_stream(io.BytesIO())
    assert not is_binary_stream(io.StringIO())
    with (tmp_path / "b").open("wb") as binary, (tmp_path / "t").open("w") as text:
        assert is_binary_stream(binary) and not is_binary_stream(text)
