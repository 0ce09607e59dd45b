"""The ring as the tracer reads it: committed records in ticket order, nothing half-written,
drops counted, a record whose writer died skipped after a while."""

from __future__ import annotations

import os
import struct

import pytest

from probescope.engines.fentry import ring as ring_module
from probescope.engines.fentry.ring import RECORD, RECORD_SIZE, RING_DATA, Ring, ring_bytes
from probescope.engines.fentry.templates import CONSTANTS

RECORDS = 8


@pytest.fixture
def ring() -> Ring:
    fd = os.memfd_create("test-ring")
    os.ftruncate(fd, ring_bytes(RECORDS))
    made = Ring(fd, RECORDS, "test-ring")
    os.close(fd)
    made.initialize()
    yield made
    made.close()


def produce(ring: Ring, ticket: int, *, commit: bool = True, site: int = 7) -> None:
    """What a stub does: take ticket `ticket` (head), fill the record, commit it."""
    memory = ring._map
    head = struct.unpack_from("<Q", memory, CONSTANTS["RING_HEAD"])[0]
    struct.pack_into("<Q", memory, CONSTANTS["RING_HEAD"], max(head, ticket + 1))
    offset = RING_DATA + (ticket % RECORDS) * RECORD_SIZE
    values = [0, site, 100 + ticket, 100, ticket, 1, 0, 0] + [ticket] * 11
    memory[offset : offset + RECORD_SIZE] = RECORD.pack(*values)
    if commit:
        struct.pack_into("<I", memory, offset, (ticket + 1) & 0xFFFFFFFF)


def test_header_is_what_the_stubs_read(ring: Ring) -> None:
    assert struct.unpack_from("<QQ", ring._map, CONSTANTS["RING_MASK"]) == (RECORDS - 1, RECORDS)
    assert ring.serving


def test_records_come_in_ticket_order_across_the_wrap(ring: Ring) -> None:
    seen = []
    for round_start in (0, 6):
        for ticket in range(round_start, round_start + 6):
            produce(ring, ticket)
        records, lost = ring.read()
        assert lost == 0
        seen += [r[4] for r in records]
    assert seen == list(range(12))
    assert struct.unpack_from("<Q", ring._map, CONSTANTS["RING_TAIL"])[0] == 12


def test_an_uncommitted_record_holds_back_the_ones_behind_it(ring: Ring) -> None:
    produce(ring, 0)
    produce(ring, 1, commit=False)
    produce(ring, 2)
    records, _ = ring.read()
    assert [r[4] for r in records] == [0]
    produce(ring, 1)  # the writer finishes
    records, _ = ring.read()
    assert [r[4] for r in records] == [1, 2]


def test_a_record_whose_writer_died_is_skipped_and_counted(
    ring: Ring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ring_module, "STUCK_SECONDS", 0.0)
    produce(ring, 0, commit=False)
    produce(ring, 1)
    assert ring.read() == ([], 0)  # first sight: wait
    records, lost = ring.read()
    assert (records, lost) == ([], 1)
    records, _ = ring.read()
    assert [r[4] for r in records] == [1]


def test_drops_are_reported_once(ring: Ring) -> None:
    struct.pack_into("<Q", ring._map, CONSTANTS["RING_DROPS"], 5)
    assert ring.read()[1] == 5
    assert ring.read()[1] == 0


def test_handshake_request_and_acknowledgement(ring: Ring) -> None:
    memory = ring._map
    struct.pack_into("<III", memory, CONSTANTS["RING_REQ_KIND"], 0x10000003, 42, 41)
    struct.pack_into("<Q", memory, CONSTANTS["RING_REQ_SEQ"], 1)
    request = ring.pending_request()
    assert request is not None and (request.tid, request.pid, request.sequence) == (42, 41, 1)
    ring.acknowledge(request)
    assert ring.pending_request() is None
