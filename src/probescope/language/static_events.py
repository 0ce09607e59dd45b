"""Spec values for the static half of tracing: kernel tracepoints and the function tracer.

`t:sched:sched_switch if prev_pid == 42`, `tracepoint:sched:*`, `f:vfs_*`, `function:*:mod:ext4`.
They name things the kernel already has, so parsing is text only; an engine checks them
against the running kernel's event list and function table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probescope.errors import SpecError
from probescope.language.model import ProbeKind

_GLOB = "*?["


@dataclass(frozen=True)
class TracepointSpec:
    """`SYSTEM:EVENT` (either may be a glob) with an optional kernel filter expression."""

    system: str
    event: str
    filter: str | None = None
    source: str | None = field(default=None, compare=False)
    kind: ProbeKind = ProbeKind.TRACEPOINT

    @property
    def is_glob(self) -> bool:
        return any(c in self.system + self.event for c in _GLOB)

    @property
    def group_name(self) -> str:
        return self.system

    @property
    def event_name(self) -> str:
        return self.event

    def definition(self) -> str:
        """The `set_event` line that enables it (the filter goes to the event's `filter`)."""
        return f"{self.system}:{self.event}"

    def __str__(self) -> str:
        text = f"tracepoint:{self.system}:{self.event}"
        return f"{text} if {self.filter}" if self.filter else text


@dataclass(frozen=True)
class FunctionSpec:
    """A `set_ftrace_filter` pattern for the function tracer (`vfs_*`, `*:mod:ext4`), or with
    `exclude` (`f:!vfs_readv`) a `set_ftrace_notrace` pattern."""

    pattern: str
    source: str | None = field(default=None, compare=False)
    kind: ProbeKind = ProbeKind.FUNCTION
    exclude: bool = False

    @property
    def group_name(self) -> str:
        return "ftrace"

    @property
    def event_name(self) -> str:
        return "function"

    @property
    def traces_everything(self) -> bool:
        """Patterns that select (nearly) every kernel function."""
        head = self.pattern.split(":", 1)[0]
        return head in ("*", "**", "") and ":mod:" not in self.pattern

    def definition(self) -> str:
        """The `set_ftrace_filter` (or `set_ftrace_notrace`) line."""
        return self.pattern

    def __str__(self) -> str:
        return f"function:{'!' if self.exclude else ''}{self.pattern}"


def parse_tracepoint(text: str, words: list[tuple[int, str]], prefix_len: int) -> TracepointSpec:
    """`t:SYSTEM:EVENT [if FILTER]` (the first word holds the prefix of `prefix_len` chars)."""
    column, first = words[0]
    body = first[prefix_len:]
    system, sep, event = body.partition(":")
    if not sep or not system or not event:
        raise SpecError(
            f"{body!r} is not SYSTEM:EVENT",
            spec=text,
            column=column + prefix_len,
            hint="e.g. tracepoint:sched:sched_switch or t:sched:* (list them with "
            "`probescope list tracepoints`)",
        )
    for part, offset in ((system, 0), (event, len(system) + 1)):
        bad = next(
            (i for i, c in enumerate(part) if not (c.isalnum() or c in "_-" or c in _GLOB + "]")),
            -1,
        )
        if bad >= 0:
            raise SpecError(
                f"invalid character {part[bad]!r} in tracepoint name",
                spec=text,
                column=column + prefix_len + offset + bad,
            )
    filter_text = None
    rest = words[1:]
    if rest:
        if rest[0][1] != "if":
            raise SpecError(
                "tracepoints take no arguments; a filter follows 'if'",
                spec=text,
                column=rest[0][0],
                hint="e.g. t:sched:sched_switch if prev_pid == 42",
            )
        if len(rest) == 1:
            raise SpecError("no filter expression after 'if'", spec=text, column=rest[0][0])
        filter_text = text[rest[1][0] :].strip()
    return TracepointSpec(system, event, filter_text, source=text)


def parse_function(text: str, words: list[tuple[int, str]], prefix_len: int) -> FunctionSpec:
    column, first = words[0]
    pattern = first[prefix_len:]
    exclude = pattern.startswith("!")
    if exclude:
        pattern = pattern[1:]
        prefix_len += 1
    if not pattern:
        raise SpecError(
            "missing function pattern",
            spec=text,
            column=column + prefix_len,
            hint="e.g. f:vfs_read, f:vfs_*, f:*:mod:ext4",
        )
    if len(words) > 1:
        raise SpecError(
            "the function tracer takes no arguments",
            spec=text,
            column=words[1][0],
            hint="give several patterns as several specs",
        )
    return FunctionSpec(pattern, source=text, exclude=exclude)
