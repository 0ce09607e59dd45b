"""A code area: one read+execute mapping in the traced program holding the stubs of nearby sites.

Layout (all written through /proc/PID/mem; the mapping is never writable):

    0x000  header: magic, the addresses the stubs read (ring, thread state, return trampoline,
           r_debug), the tracer's pid and start time (whose area this is), sizes
    0x080  site table: per site the patched address, the function's address, the stub, the
           patch length and the original bytes — what the next run or `probescope cleanup -p`
           restores from when probescope was SIGKILLed
    ...    the common code (templates "common"), then one stub per site

Every area carries its own copy of the common code (a stub reaches it with `call rel32`); the
return trampoline used for hooks is the first area's, so that a chained tail call across
libraries recognizes it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from probescope.engines.fentry import relocate
from probescope.engines.fentry.plan import SitePlan
from probescope.engines.fentry.templates import CONSTANTS, TEMPLATES

MAGIC = b"probescope-fentr"
VERSION = 1
PAGE = 4096

HDR_MAGIC = 0x00
HDR_VERSION = 0x10
HDR_SIZE = 0x14
HDR_RING = 0x18
HDR_STATE = 0x20
HDR_TRAMPOLINE = 0x28
HDR_RDEBUG = 0x30
HDR_TRACER_PID = 0x38
HDR_SITES = 0x3C
HDR_ONE_MS = 0x40
HDR_OWNER_START = 0x50
HDR_RING_SIZE = 0x58
HDR_STATE_SIZE = 0x60
HDR_OWNER_PID = 0x68
HDR_CAPACITY = 0x70
HDR_SESSION = 0x74
HEADER_SIZE = 0x80

SITE_ENTRY = 48
SITE_PATCH = 0
SITE_FUNCTION = 8
SITE_STUB = 16
SITE_LENGTH = 24
SITE_WORD = 28
SITE_ORIGINAL = 32
STUB_SLOT = 64

SITE_NUMBER_MASK = 0x00FFFFFF
F_ENTRY = CONSTANTS["F_ENTRY"]
F_RETURN = CONSTANTS["F_RETURN"]
F_EXPOSE = CONSTANTS["F_EXPOSE"]
F_CATCH = CONSTANTS["F_CATCH"]
F_DLOPEN = CONSTANTS["F_DLOPEN"]
F_EXEC = CONSTANTS["F_EXEC"]

_HEADER_SYMBOLS = {
    "ring_ptr": HDR_RING,
    "state_ptr": HDR_STATE,
    "trampoline_ptr": HDR_TRAMPOLINE,
    "rdebug_ptr": HDR_RDEBUG,
    "tracer_pid": HDR_TRACER_PID,
    "one_ms": HDR_ONE_MS,
}
_COMMON = TEMPLATES["common"]
_STUB_HEAD = TEMPLATES["site_stub"]
_COMMON_OFFSET_ALIGN = 64


@dataclass(frozen=True)
class Owner:
    """The tracer an area belongs to: its pid (as the program sees it, 0 when invisible), its
    pid and start time in our namespace (to tell a live owner from a dead one)."""

    visible_pid: int
    pid: int
    start_time: int
    session: int = 0  # tells apart sessions of one probescope process


@dataclass(eq=False)
class PlacedSite:
    """One patched site in one process."""

    plan: SitePlan
    address: int  # where the jump is
    function_address: int
    stub: int
    word: int  # site number | flags
    patch: bytes  # the jump and its int3 fill
    row: int = 0  # its index in the area's site table

    @property
    def number(self) -> int:
        return self.word & SITE_NUMBER_MASK

    @property
    def original(self) -> bytes:
        return self.plan.original


def area_size(sites: int) -> int:
    """Bytes for an area with room for `sites` stubs, in whole pages."""
    size = common_offset(sites) + len(_COMMON) + sites * STUB_SLOT
    return (size + PAGE - 1) // PAGE * PAGE


def capacity_for(size: int) -> int:
    """How many sites fit an area of `size` bytes."""
    count = max(
        0, (size - HEADER_SIZE - len(_COMMON) - _COMMON_OFFSET_ALIGN) // (SITE_ENTRY + STUB_SLOT)
    )
    while count and area_size(count) > size:
        count -= 1
    return count


def common_offset(capacity: int) -> int:
    end = HEADER_SIZE + capacity * SITE_ENTRY
    return (end + _COMMON_OFFSET_ALIGN - 1) // _COMMON_OFFSET_ALIGN * _COMMON_OFFSET_ALIGN


@dataclass
class CodeArea:
    """One injected r-x area: where things go, and the bytes to write there."""

    start: int
    size: int
    ring: int
    ring_size: int
    state: int
    state_size: int
    owner: Owner
    rdebug: int = 0
    trampoline: int | None = None  # None: this area's own
    sites: list[PlacedSite] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return capacity_for(self.size)

    @property
    def common(self) -> int:
        return self.start + common_offset(self.capacity)

    @property
    def own_trampoline(self) -> int:
        return self.common + _COMMON.symbols["return_trampoline"]

    @property
    def hook_trampoline(self) -> int:
        return self.own_trampoline if self.trampoline is None else self.trampoline

    @property
    def full(self) -> bool:
        return len(self.sites) >= self.capacity

    def contains(self, address: int) -> bool:
        return self.start <= address < self.start + self.size

    def reaches(self, address: int) -> bool:
        """Whether a rel32 jump between `address` and any byte of the area fits."""
        low, high = self.start, self.start + self.size
        return high - address < (1 << 31) - 16 and address - low < (1 << 31) - 16

    # -- bytes --------------------------------------------------------------------------------

    def header(self) -> bytes:
        out = bytearray(HEADER_SIZE)
        out[HDR_MAGIC : HDR_MAGIC + len(MAGIC)] = MAGIC
        struct.pack_into("<II", out, HDR_VERSION, VERSION, self.size)
        struct.pack_into(
            "<QQQQ", out, HDR_RING, self.ring, self.state, self.hook_trampoline, self.rdebug
        )
        struct.pack_into("<II", out, HDR_TRACER_PID, self.owner.visible_pid, len(self.sites))
        struct.pack_into("<qq", out, HDR_ONE_MS, 0, 1_000_000)
        struct.pack_into(
            "<QQQQII",
            out,
            HDR_OWNER_START,
            self.owner.start_time,
            self.ring_size,
            self.state_size,
            self.owner.pid,
            self.capacity,
            self.owner.session,
        )
        return bytes(out)

    def common_code(self) -> bytes:
        return _COMMON.place(self.common, self._resolver(0))

    def place(self, plan: SitePlan, address: int, function_address: int, word: int) -> PlacedSite:
        """Assign the next stub slot to a site; returns it (nothing is written yet)."""
        if self.full:
            raise relocate.Refused("code area full")
        stub = self.common + len(_COMMON) + len(self.sites) * STUB_SLOT
        patch = relocate.jump(address, stub) + b"\xcc" * (plan.length - relocate.JMP_SIZE)
        site = PlacedSite(plan, address, function_address, stub, word, patch, len(self.sites))
        self.stub_code(site)  # raises Refused when the displaced code cannot reach
        self.sites.append(site)
        return site

    def stub_code(self, site: PlacedSite) -> bytes:
        head = _STUB_HEAD.place(site.stub, self._resolver(site.word))
        body = relocate.relocate(site.plan.displaced, site.address, site.stub + len(head))
        code = head + body
        if not site.plan.ends_in_stub:
            code += relocate.jump(site.stub + len(code), site.address + site.plan.length)
        if len(code) > STUB_SLOT:
            raise relocate.Refused(f"{site.plan.function}: stub of {len(code)} bytes")
        return code

    def site_entry(self, site: PlacedSite) -> tuple[int, bytes]:
        """(address, bytes) of the site's row in the area's site table."""
        index = site.row
        row = bytearray(SITE_ENTRY)
        struct.pack_into(
            "<QQQBBHI",
            row,
            0,
            site.address,
            site.function_address,
            site.stub,
            site.plan.length,
            1,
            0,
            site.word,
        )
        row[SITE_ORIGINAL : SITE_ORIGINAL + site.plan.length] = site.plan.original
        return self.start + HEADER_SIZE + index * SITE_ENTRY, bytes(row)

    def _resolver(self, word: int) -> Callable[[str], int]:
        def resolve(symbol: str) -> int:
            if symbol in _HEADER_SYMBOLS:
                return self.start + _HEADER_SYMBOLS[symbol]
            if symbol == "SITE_WORD":
                return word
            if symbol in _COMMON.symbols:
                return self.common + _COMMON.symbols[symbol]
            raise relocate.Refused(f"template hole for unknown symbol {symbol!r}")

        return resolve


def parse_header(data: bytes) -> dict[str, int] | None:
    """The fields of an area header read back from a process (None: not one of ours)."""
    if len(data) < HEADER_SIZE or data[: len(MAGIC)] != MAGIC:
        return None
    version, size = struct.unpack_from("<II", data, HDR_VERSION)
    ring, state, trampoline, rdebug = struct.unpack_from("<QQQQ", data, HDR_RING)
    visible, sites = struct.unpack_from("<II", data, HDR_TRACER_PID)
    start_time, ring_size, state_size, owner_pid, capacity, session = struct.unpack_from(
        "<QQQQII", data, HDR_OWNER_START
    )
    return {
        "version": version,
        "size": size,
        "ring": ring,
        "state": state,
        "trampoline": trampoline,
        "rdebug": rdebug,
        "visible_pid": visible,
        "sites": sites,
        "start_time": start_time,
        "ring_size": ring_size,
        "state_size": state_size,
        "owner_pid": owner_pid,
        "capacity": capacity,
        "session": session,
    }


def parse_site_rows(data: bytes, count: int) -> list[tuple[int, int, bytes, bool]]:
    """(patched address, length, original bytes, patched) of each row of a site table."""
    rows = []
    for index in range(count):
        base = index * SITE_ENTRY
        if base + SITE_ENTRY > len(data):
            break
        address, _, _, length, state, _, _ = struct.unpack_from("<QQQBBHI", data, base)
        original = data[base + SITE_ORIGINAL : base + SITE_ORIGINAL + length]
        rows.append((address, length, original, bool(state & 1)))
    return rows
