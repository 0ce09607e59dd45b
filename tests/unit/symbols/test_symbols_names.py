"""NameIndex: packed spellings answer exactly as a plain dict of (number, version, …) lists."""

from __future__ import annotations

import marshal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probescope.symbols.names import BINDINGS, NameIndex

NAMES = st.sampled_from(["malloc", "__libc_malloc", "memcpy", "f", "a.cold", "x@y", ""])
VERSIONS = st.none() | st.sampled_from(["GLIBC_2.2.5", "GLIBC_2.14", "V1", "LIBC_PRIVATE"])
SPELLING = st.tuples(NAMES, VERSIONS, st.booleans(), st.sampled_from(BINDINGS))
TABLES = st.lists(st.lists(SPELLING, min_size=1, max_size=5), max_size=40)


def _plain_index(table: list[list[tuple[str, str | None, bool, str]]]) -> dict[str, list]:
    index: dict[str, list] = {}
    for number, spellings in enumerate(table):
        for name, version, hidden, binding in spellings:
            index.setdefault(name, []).append((number, version, hidden, binding))
    return index


@settings(max_examples=300, deadline=None)
@given(TABLES)
def test_spellings_match_a_plain_index(table) -> None:  # type: ignore[no-untyped-def]
    expected = _plain_index(table)
    for index in (
        NameIndex.build(table),
        NameIndex(*marshal.loads(marshal.dumps(NameIndex.build(table).state()))),
    ):
        assert sorted(index) == sorted(expected)
        assert len(index) == len(expected)
        for name, spellings in expected.items():
            assert name in index
            assert index.spellings(name) == spellings
        assert index.spellings("no such name") == []
        assert "no such name" not in index


@settings(max_examples=300, deadline=None)
@given(TABLES, NAMES, VERSIONS, st.none() | st.booleans())
def test_single_is_the_one_matching_spelling(table, name, version, default) -> None:  # type: ignore[no-untyped-def]
    index = NameIndex.build(table)
    spellings = _plain_index(table).get(name, [])
    found = index.single(name, version, default)
    if len(spellings) != 1:
        assert found is None
        return
    number, its_version, hidden, _ = spellings[0]
    matches = version is None or (its_version == version and not (default and hidden))
    assert found == (number if matches else None)


def test_large_function_numbers_and_many_versions_survive_packing() -> None:
    table = [[(f"f{n}", f"V{n % 3000}", n % 2 == 1, BINDINGS[n % 4])] for n in range(70_000)]
    index = NameIndex.build(table)
    assert index.spellings("f69999") == [(69999, "V999", True, BINDINGS[69999 % 4])]
    assert index.single("f69998", "V998", True) == 69998
    assert index.single("f69999", "V999", True) is None  # hidden: not the default version


def test_an_unknown_binding_is_refused() -> None:
    with pytest.raises(KeyError):
        NameIndex.build([[("f", None, False, "secret")]])
