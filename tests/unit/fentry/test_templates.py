"""The checked-in template table is exactly what binutils makes of stubs.S, and holes fill as a
linker would."""

from __future__ import annotations

import importlib.util
import shutil
import struct
from pathlib import Path

import capstone
import pytest

from probescope.engines.fentry.template import ABS32, PC32, Hole, Template
from probescope.engines.fentry.templates import CONSTANTS, TEMPLATES

ROOT = Path(__file__).resolve().parents[3]


def _tool():  # tools/ is not a package: load the generator by path
    spec = importlib.util.spec_from_file_location(
        "fentry_templates", ROOT / "tools/fentry_templates.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("as") is None, reason="binutils `as` is not installed")
def test_table_matches_a_fresh_assembly_of_the_source() -> None:
    tool = _tool()
    table = ROOT / "src/probescope/engines/fentry/templates.py"
    assert tool.generate() == table.read_text(), "run: python tools/fentry_templates.py"


def test_every_template_decodes_to_the_end() -> None:
    decoder = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    for name, template in TEMPLATES.items():
        decoded = sum(size for _, size, _, _ in decoder.disasm_lite(template.code, 0))
        assert decoded == len(template.code), name


def test_site_stub_calls_the_common_code_with_its_site_word() -> None:
    stub = TEMPLATES["site_stub"]
    kinds = {(hole.symbol, hole.kind) for hole in stub.holes}
    assert kinds == {("SITE_WORD", ABS32), ("fentry_common", PC32)}


def test_constants_agree_with_the_record_layout() -> None:
    assert 1 << CONSTANTS["RECORD_SHIFT"] == 128
    assert CONSTANTS["REC_STACK2"] + 8 == 128
    assert CONSTANTS["THREADS"] * CONSTANTS["THREAD_ENTRY"] == CONSTANTS["FRAMES_OFFSET"]
    assert (
        CONSTANTS["MAX_DEPTH"] * CONSTANTS["FRAME_SIZE"]
        == 1 << CONSTANTS["FRAMES_PER_THREAD_SHIFT"]
    )


def test_place_fills_pc_relative_and_absolute_holes() -> None:
    template = Template(
        "t",
        bytes.fromhex("e800000000b800000000"),
        {},
        (Hole(1, PC32, "target", -4), Hole(6, ABS32, "value", 0)),
    )
    values = {"target": 0x1000, "value": 0xDEADBEEF}
    code = template.place(0x2000, values.__getitem__)
    (rel,) = struct.unpack_from("<i", code, 1)
    assert 0x2000 + 5 + rel == 0x1000
    assert struct.unpack_from("<I", code, 6)[0] == 0xDEADBEEF


def test_a_hole_out_of_reach_is_an_error_not_a_wrong_jump() -> None:
    template = Template("t", bytes(5), {}, (Hole(1, PC32, "far", -4),))
    with pytest.raises(Exception, match="out of reach"):
        template.place(0, lambda symbol: 1 << 40)
