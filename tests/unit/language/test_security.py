"""The definition text is a security boundary: nothing may smuggle a second command, a comment
or a split word into a tracefs file."""

from __future__ import annotations

import pytest

from probescope.errors import SpecError
from probescope.language.kernel_grammar import EventsFile, check_definition_text, parse_kernel_probe
from probescope.language.parse import parse_probe

SMUGGLERS = [
    "p:ev /bin/true:0x10\n-:uprobes/other",
    "p:ev /bin/true:0x10\r-:x",
    "p:ev /bin/true:0x10 #%di",
    "p:ev /bin/true:0x10; -:uprobes/x",
    "p:ev /bin/tr\0ue:0x10",
    "p:ev /bin/true:0x10 \x0b%di",
    "p:ev /bin/true:0x10 \x0c%di",
    "p:ev /tmp/\u00e0b:0x10",  # UTF-8 c3 a0: the kernel's isspace(0xa0) would split the path
    "bash:readline\n-:uprobes/x",
    "bash:readline #comment",
    "c:malloc;ls",
    "p:ev /bin/true:0x10 \x7f",
]


@pytest.mark.parametrize("text", SMUGGLERS)
def test_smuggling_is_refused_in_both_forms(text: str) -> None:
    with pytest.raises(SpecError, match="refused character") as info:
        parse_probe(text)
    assert info.value.column is not None
    with pytest.raises(SpecError):
        parse_kernel_probe(text, events_file=EventsFile.UPROBE_EVENTS)


def test_caret_points_at_the_smuggled_character() -> None:
    text = "p:ev /bin/true:0x10;-:x"
    with pytest.raises(SpecError) as info:
        check_definition_text(text)
    assert info.value.column == text.index(";")


def test_too_long_a_line_is_refused() -> None:
    text = "p:ev /bin/true:0x10 " + " ".join(["%di"] * 1100)
    with pytest.raises(SpecError, match="at most 4094"):
        check_definition_text(text)


def test_non_latin_paths_without_0xa0_are_fine() -> None:
    spec = parse_kernel_probe("p:ev /tmp/caf\u00e9:0x10", events_file=EventsFile.UPROBE_EVENTS)
    assert "/tmp/caf\u00e9:0x0000000000000010" in str(spec)


def test_render_escapes_control_characters() -> None:
    with pytest.raises(SpecError) as info:
        parse_probe("bash:readline\n-:x")
    rendered = info.value.render()
    assert "\\n" in rendered
    caret_line = rendered.splitlines()[2]
    assert caret_line.index("^") == len("  bash:readline")
