"""The Sink protocol every output implements, and the registry of output formats by name.

A sink receives `Event`s (one by one or as `EventBatch`es) from any engine and writes them to a
stream it is given; it never opens files or touches the terminal itself, and `close()` flushes
but leaves the stream to its owner. What it needs to know of the kernel that wrote the events
(symbols, types, printing facts) it is given as a `KernelContext`; it never reads the machine
it runs on. Formats are looked up by the name the CLI's `--format` takes; built-in formats are
imported on first use, others can be added with `register_format`.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Protocol

from probescope.errors import ProbescopeError
from probescope.events import Event, EventBatch
from probescope.traceevent.context import KernelContext


class OutputFormatError(ProbescopeError):
    """An output format name that no sink is registered for, or options it does not take."""


class Sink(Protocol):
    """An output: events one by one or in batches; `flush()` after each batch makes a live
    stream readable as it grows; `close()` flushes and leaves the stream to its owner."""

    def write(self, event: Event) -> None: ...

    def write_batch(self, batch: EventBatch) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class OutputFormat:
    """A named output: `factory(stream, context=KernelContext, **options)` makes its sink;
    `binary` says whether the stream should be opened in binary mode (a text sink also accepts
    binary streams)."""

    name: str
    description: str
    factory: Callable[..., Sink]
    binary: bool = False


_BUILTIN: dict[str, tuple[str, str]] = {
    "text": ("probescope.sinks.text", "TEXT_FORMAT"),
    "jsonl": ("probescope.sinks.jsonl", "JSONL_FORMAT"),
    "perfetto": ("probescope.sinks.perfetto", "PERFETTO_FORMAT"),
    "parquet": ("probescope.sinks.parquet", "PARQUET_FORMAT"),
}
_REGISTERED: dict[str, OutputFormat] = {}


def register_format(output_format: OutputFormat) -> None:
    """Add (or replace) an output format."""
    _REGISTERED[output_format.name] = output_format


def output_format(name: str) -> OutputFormat:
    """The output format called `name`."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module, attribute = _BUILTIN[name]
        found: OutputFormat = getattr(importlib.import_module(module), attribute)
        _REGISTERED[name] = found
        return found
    raise OutputFormatError(
        f"unknown output format {name!r}", hint=f"choose one of: {', '.join(output_formats())}"
    )


def output_formats() -> list[str]:
    """Names of every known output format, sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def open_sink(
    name: str, stream: IO[Any], *, context: KernelContext | None = None, **options: Any
) -> Sink:
    """A sink of format `name` writing to `stream`, printing with what `context` knows of the
    kernel (a session's `kernel_context()`; a minimal context without)."""
    chosen = output_format(name)
    try:
        return chosen.factory(stream, context=context or KernelContext(), **options)
    except TypeError as error:
        raise OutputFormatError(f"output format {name!r}: {error}") from None


def is_binary_stream(stream: IO[Any]) -> bool:
    """Whether `stream` takes bytes (raw or buffered binary file, BytesIO)."""
    if isinstance(stream, io.TextIOBase):
        return False
    if isinstance(stream, io.RawIOBase | io.BufferedIOBase):
        return True
    return not hasattr(stream, "encoding")
