"""Parse the kernel's tracefs `error_log`: what the kernel refused, in which command, where.

Format (`tracing_err_log_seq_show`): `[%5llu.%06u] LOCATION: error: TEXT`, then
`  Command: CMD`, then spaces and a caret under the offending character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEAD = re.compile(r"^\[\s*(\d+\.\d+)\] (.+?): error: (.*)$")
_COMMAND_PREFIX = "  Command: "


@dataclass(frozen=True)
class ErrorLogEntry:
    timestamp: str
    location: str  # trace_uprobe, trace_kprobe, event filter parser, ...
    message: str
    command: str | None
    column: int | None  # index into `command` of the caret


def parse_error_log(text: str) -> list[ErrorLogEntry]:
    entries: list[ErrorLogEntry] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _HEAD.match(lines[i])
        i += 1
        if not match:
            continue
        command = column = None
        if i < len(lines) and lines[i].startswith(_COMMAND_PREFIX):
            command = lines[i][len(_COMMAND_PREFIX) :]
            i += 1
            if i < len(lines) and lines[i].rstrip().endswith("^"):
                column = len(lines[i].rstrip()) - 1 - len(_COMMAND_PREFIX)
                i += 1
        entries.append(
            ErrorLogEntry(match.group(1), match.group(2), match.group(3), command, column)
        )
    return entries
