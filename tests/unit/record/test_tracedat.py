"""trace.dat written and read back: the version 6 layout field by field (options, formats,
page-aligned CPU data), probescope's facts in their option, and files that are not trace.dat."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

from probescope.errors import RecordingError
from probescope.language.model import ArgType
from probescope.record.facts import EventDescription, MappedFile, ProcessMaps, RecordingFacts
from probescope.record.synthesis import HEADER_EVENT, HEADER_PAGE
from probescope.record.tracedat import MAGIC, OPTION_PROBESCOPE, OPTION_TRACECLOCK, TraceDat
from probescope.record.tracedat_writer import CpuSource, TraceDatContents, write_tracedat

FORMAT = (
    b"name: e\nID: 7\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
)


def contents(**options: bytes) -> TraceDatContents:
    return TraceDatContents(
        header_page=HEADER_PAGE.encode(),
        header_event=HEADER_EVENT.encode(),
        ftrace_formats=[b"name: function\nID: 1\n"],
        event_formats=[
            ("grp", FORMAT),
            ("grp", FORMAT.replace(b"ID: 7", b"ID: 8")),
            ("tp", FORMAT),
        ],
        kallsyms=b"ffffffff81000000 T _stext\n",
        printk_formats=b'0xffffffff82000000 : "hello"\n',
        saved_cmdlines=b"42 loop\n",
        options=[(OPTION_TRACECLOCK, b"local [mono] boot\0"), (0x7777, b"anything")],
    )


def test_a_written_file_reads_back_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "t.dat"
    cpu0, cpu2 = bytes(range(256)) * 16, b"\xab" * 8192
    with open(path, "wb") as stream:
        size = write_tracedat(
            stream, contents(), [CpuSource(data=cpu0), CpuSource(), CpuSource(data=cpu2)]
        )
    raw = path.read_bytes()
    assert len(raw) == size
    # magic, "6\0", little-endian, 8-byte longs, 4096-byte pages
    assert raw[:10] == MAGIC and raw[10:12] == b"6\0" and raw[12:14] == b"\0\x08"
    assert struct.unpack_from("<I", raw, 14)[0] == 4096
    with TraceDat.from_path(path) as dat:
        assert (dat.version, dat.byteorder, dat.long_size, dat.page_size) == (6, "little", 8, 4096)
        assert dat.header_page == HEADER_PAGE.encode()
        assert dat.header_event == HEADER_EVENT.encode()
        assert dat.ftrace_formats == [b"name: function\nID: 1\n"]
        assert [s for s, _ in dat.event_formats] == ["grp", "grp", "tp"]
        assert dat.kallsyms.startswith(b"ffffffff81000000")
        assert dat.saved_cmdlines == b"42 loop\n"
        assert dat.cpu_count == 3
        assert dat.trace_clock == "mono"
        assert dat.option(0x7777) == b"anything"
        (buffer,) = dat.buffers
        offsets = [cpu.offset for cpu in buffer.cpus]
        assert all(offset % 4096 == 0 for offset in offsets)
        assert [cpu.size for cpu in buffer.cpus] == [len(cpu0), 0, len(cpu2)]
        assert b"".join(dat.sub_buffers(buffer, buffer.cpus[0])) == cpu0
        assert b"".join(dat.sub_buffers(buffer, buffer.cpus[1])) == b""
        assert b"".join(dat.sub_buffers(buffer, buffer.cpus[2])) == cpu2


def test_cpu_data_is_copied_from_a_file_descriptor(tmp_path: Path) -> None:
    source = tmp_path / "cpu0"
    source.write_bytes(b"x" * 100 + b"\x11" * 4096)
    out = io.BytesIO()
    with open(source, "rb") as stream, open(tmp_path / "t.dat", "w+b") as target:
        write_tracedat(target, contents(), [CpuSource(fd=stream.fileno(), size=4096, offset=100)])
        target.seek(0)
        out.write(target.read())
    with TraceDat(io.BytesIO(out.getvalue())) as dat:
        pass
    with TraceDat.from_path(tmp_path / "t.dat") as dat:
        buffer = dat.buffers[0]
        assert b"".join(dat.sub_buffers(buffer, buffer.cpus[0])) == b"\x11" * 4096


def test_facts_survive_their_option() -> None:
    facts = RecordingFacts(
        engine="ptrace",
        release="6.18.0",
        events=[
            EventDescription(
                61440,
                "uprobes",
                "f",
                "uretprobe",
                ("v", "bits"),
                (
                    ArgType("x64", "x64", 8, False),
                    ArgType("b4@2/32", "u32", 4, False, (4, 2, 32)),
                ),
            )
        ],
        comms={7: "t\udcff"},
        tgids={7: 6},
        enums={"HRTIMER_MODE_ABS": 0},
        typedefs={"pid_t": (4, True)},
        processes=[ProcessMaps(6, 10, "t", ((0x1000, 0x2000, 0, "/bin/t"),))],
        files=[MappedFile("/bin/t", "abcd", ((0x1000, 16, "main"),))],
    )
    back = RecordingFacts.from_option(facts.to_option())
    assert back == facts


@pytest.mark.parametrize(
    "data, message",
    [
        (b"not a trace", "not a trace.dat"),
        (MAGIC + b"5\0", "version '5'"),
        (MAGIC + b"6\0\0\x08\0\x10\0\0header_page\0\xff", "ends"),
    ],
)
def test_what_is_not_a_trace_dat_is_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(RecordingError, match=message):
        TraceDat(io.BytesIO(data))


def test_damaged_facts_are_refused() -> None:
    with pytest.raises(RecordingError, match="probescope"):
        RecordingFacts.from_option(b"something else")
    assert OPTION_PROBESCOPE == 0x5053
