"""`KernelContext`: what decoding and printing events need to know of the kernel that wrote them.

libtraceevent's `tep_handle`, as one immutable value: the events' `format` files, the ring
buffer's page and record layout, the kernel's symbols (kallsyms), types (BTF) and strings
(printk_formats), the tasks it had named, and the facts of its release that change how `trace`
prints (the latency flag letters). It is built once — from the live machine by the session
(engines/tracefs/kernel_context.py), or from a directory of captured files with
`from_directory` — and handed to whoever decodes or prints, so a recording prints the same on
another machine. Nothing here reads the live machine.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from probescope.errors import RingBufferFormatError
from probescope.traceevent.btf import KernelTypes
from probescope.traceevent.format import (
    EventFormat,
    HeaderEvent,
    HeaderPage,
    parse_event_format,
    parse_header_event,
    parse_header_page,
    parse_saved_cmdlines,
    parse_saved_tgids,
)
from probescope.traceevent.kallsyms import KernelSymbols
from probescope.traceevent.printk_formats import parse_printk_formats
from probescope.traceevent.ringbuffer import SubBufferLayout

LAZY_RESCHED_SINCE = (6, 13)
"""The first release whose `common_flags` bit 1 is NEED_RESCHED_LAZY (it was IRQS_NOSUPPORT)."""


def kernel_has_lazy_resched_flag(release: str) -> bool:
    """Whether a kernel of `release` (`uname -r`) gives bit 1 of common_flags to
    NEED_RESCHED_LAZY, as Linux 6.13 and later do; a release that cannot be read counts as new."""
    numbers = release.split("-", 1)[0].split(".")
    try:
        major, minor = int(numbers[0]), int(numbers[1])
    except (IndexError, ValueError):
        return True
    return (major, minor) >= LAZY_RESCHED_SINCE


@dataclass(frozen=True)
class KernelContext:
    """What decoding and printing need from one kernel. Every field has a default, so a minimal
    context (a ptrace-only session, a unit test) names only what it knows.

    `release` is the kernel's `uname -r`. `formats` are the `format` files of the events to
    decode, `header_page`/`header_event`/`byteorder` the layout of the ring buffer's
    sub-buffers and records (see `layout`). `symbols` (kallsyms) serve `%pS`-style addresses,
    kprobe and function-tracer lines; `types` (BTF) resolve the enum names and typedefs print
    fmts leave as names, and `enums` adds names of your own (they win over `types`); `strings`
    (`printk_formats`: address to text of each `tracepoint_string()`) let `%s` print a kernel
    pointer. `comms` and `tgids` are the tasks the kernel had named (`saved_cmdlines`,
    `saved_tgids`) when the events were read. `hash_pointers` is the recording instance's
    `options/hash-ptr`: on (the kernel's default), plain `%p` prints a keyed hash of the
    address that cannot be reproduced. `lazy_resched` and `irqflags_support` choose the
    latency-flag letters (see `sinks.text.lat_flags`). `refused_formats` lists, by
    `system/event`, formats a reader could not parse and left out (with why).
    """

    release: str | None = None
    formats: tuple[EventFormat, ...] = ()
    header_page: HeaderPage | None = None
    header_event: HeaderEvent = field(default_factory=HeaderEvent)
    byteorder: Literal["little", "big"] = sys.byteorder
    symbols: KernelSymbols | None = None
    types: KernelTypes | None = None
    enums: Mapping[str, int] = field(default_factory=dict)
    strings: Mapping[int, str] | None = None
    comms: Mapping[int, str] = field(default_factory=dict)
    tgids: Mapping[int, int] = field(default_factory=dict)
    hash_pointers: bool = True
    lazy_resched: bool = True
    irqflags_support: bool = True
    refused_formats: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_release(cls, release: str, **values: Any) -> KernelContext:
        """A context for a kernel of `release`, its release-dependent printing facts set
        accordingly; `values` give the other fields."""
        values.setdefault("lazy_resched", kernel_has_lazy_resched_flag(release))
        return cls(release=release, **values)

    @classmethod
    def from_directory(cls, path: str | Path, *, skip_bad_formats: bool = False) -> KernelContext:
        """A context from files captured from a kernel (a recording, a test fixture), each one
        optional: `meta.json` (`release`, `byteorder`, `hash_ptr`), `header_page`,
        `header_event`, `formats/SYSTEM.EVENT` (each event's `format` file), `kallsyms`, `btf`
        (raw BTF, a copy of /sys/kernel/btf/vmlinux), `enums.json` (name to value),
        `printk_formats`, `saved_cmdlines` and `saved_tgids`. A format that does not parse
        raises `RingBufferFormatError`, or with `skip_bad_formats` is left out and listed in
        `refused_formats`."""
        root = Path(path)
        meta: dict[str, Any] = {}
        if (root / "meta.json").is_file():
            meta = json.loads((root / "meta.json").read_text())
        values: dict[str, Any] = {}
        if "byteorder" in meta:
            values["byteorder"] = meta["byteorder"]
        if "hash_ptr" in meta:
            values["hash_pointers"] = bool(meta["hash_ptr"])
        if (root / "header_page").is_file():
            values["header_page"] = parse_header_page((root / "header_page").read_text())
        if (root / "header_event").is_file():
            values["header_event"] = parse_header_event((root / "header_event").read_text())
        formats, refused = _read_formats(root / "formats", skip_bad_formats)
        values["formats"] = formats
        values["refused_formats"] = refused
        if (root / "kallsyms").is_file():
            values["symbols"] = KernelSymbols.from_path(root / "kallsyms")
        if (root / "btf").is_file():
            values["types"] = KernelTypes.from_path(root / "btf")
        if (root / "enums.json").is_file():
            values["enums"] = json.loads((root / "enums.json").read_text())
        if (root / "printk_formats").is_file():
            text = (root / "printk_formats").read_text("utf-8", "surrogateescape")
            values["strings"] = parse_printk_formats(text)
        if (root / "saved_cmdlines").is_file():
            values["comms"] = parse_saved_cmdlines((root / "saved_cmdlines").read_bytes())
        if (root / "saved_tgids").is_file():
            values["tgids"] = parse_saved_tgids((root / "saved_tgids").read_bytes())
        release = meta.get("release")
        if isinstance(release, str):
            return cls.for_release(release, **values)
        return cls(**values)

    def with_formats(self, formats: Iterable[EventFormat]) -> KernelContext:
        """This context with more event formats (those of the events a session created)."""
        return replace(self, formats=(*self.formats, *formats))

    def layout(self, sub_buffer_size: int | None = None) -> SubBufferLayout:
        """The sub-buffer layout of this kernel's ring buffer (`sub_buffer_size`: bytes of the
        instance's `buffer_subbuf_size_kb`, when known); a 64-bit kernel with 4 KiB
        sub-buffers when the context has no `header_page`."""
        if self.header_page is None:
            return SubBufferLayout(byteorder=self.byteorder, header_event=self.header_event)
        return SubBufferLayout.from_header_page(
            self.header_page,
            header_event=self.header_event,
            sub_buffer_size=sub_buffer_size,
            byteorder=self.byteorder,
        )

    def enum_value(self, name: str) -> int | None:
        """The value of an enum constant a print fmt names, if this context knows it."""
        if name in self.enums:
            return self.enums[name]
        if self.types is not None:
            return self.types.enums.get(name)
        return None

    def print_symbol(self, address: int, *, offset: bool = True) -> str:
        """`%pS` (`name+0xoff/0xsize [module]`) or `%ps` (`name`) of a kernel address; `0x...`
        when the context has no symbols or none holds the address."""
        if self.symbols is None:
            return f"0x{address:x}"
        return self.symbols.symbol(address, offset=offset)


def _read_formats(
    directory: Path, skip_bad_formats: bool
) -> tuple[tuple[EventFormat, ...], dict[str, str]]:
    formats: list[EventFormat] = []
    refused: dict[str, str] = {}
    if not directory.is_dir():
        return (), refused
    for format_path in sorted(directory.iterdir()):
        system = format_path.name.split(".", 1)[0]
        try:
            formats.append(parse_event_format(format_path.read_text(), system=system))
        except RingBufferFormatError as error:
            if not skip_bad_formats:
                raise RingBufferFormatError(
                    f"{format_path}: {error.message}", hint=error.hint
                ) from None
            refused[format_path.name.replace(".", "/", 1)] = error.message
    return tuple(formats), refused
