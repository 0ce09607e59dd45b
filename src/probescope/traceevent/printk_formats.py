"""tracefs's `printk_formats`: the text of every `tracepoint_string()` and trace_printk format,
by the kernel address a record holds in its place."""

from __future__ import annotations

import re

_PRINTK_FORMAT = re.compile(r'^0x([0-9a-fA-F]+) : "(.*)"$')


def parse_printk_formats(text: str) -> dict[int, str]:
    """tracefs `printk_formats` (`0xADDR : "TEXT"` per line) as {address: text}; the kernel
    escapes newlines, tabs and quotes there (kernel/trace/trace_printk.c `t_show`)."""
    strings: dict[int, str] = {}
    for line in text.splitlines():
        match = _PRINTK_FORMAT.match(line)
        if match:
            body = match.group(2).replace("\\n", "\n").replace("\\t", "\t")
            strings[int(match.group(1), 16)] = body.replace('\\"', '"')
    return strings
