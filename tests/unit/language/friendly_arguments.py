"""Hypothesis strategies for the friendly form's arguments (`argN`, `retval` and the rest).

Shared by the lowering property test (tests/unit/language) and the live differential test of
lowered arguments (tests/integration/language).
"""

from __future__ import annotations

from hypothesis import strategies as st

# Mostly what users write; rarer spellings and mistakes (about one argument in five) keep the
# refusals compared too.
_ABI = ("arg1", "arg2", "arg3", "arg6", "arg7", "arg8", "arg9", "arg10", "arg01", "$arg3")
_friendly_leaves = st.sampled_from([*_ABI, "$arg8", "retval", "retval", "$retval"])
_KERNEL = ("%di", "%x0", "%ax", "$stack", "$stack2", "$comm", "@0x10", "@+8", "\\5", "\\0x7b")
_ODD = ('\\"s"', '\\"arg1"', "$retvalx", "arg0", "argx", "arg1x", "@arg1", "%arg1", "$arg1")
_kernel_leaves = st.sampled_from([*_KERNEL, *_ODD])


def _rarely(common: list[str], rare: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(common), st.sampled_from(common), st.sampled_from(rare))


@st.composite
def _fetch(draw: st.DrawFn) -> str:
    fetch = draw(st.one_of(_friendly_leaves, _friendly_leaves, _friendly_leaves, _kernel_leaves))
    for _ in range(draw(st.integers(0, 2))):
        sign = draw(st.sampled_from(["+", "+", "-", "+u"]))
        offset = draw(st.sampled_from(["0", "8", "0x10", "010"]))
        fetch = f"{sign}{offset}({fetch})"
    return fetch


@st.composite
def argument(draw: st.DrawFn) -> str:
    name = draw(_rarely(["", "", "x=", "y="], ["arg1=", "retval=", "arg2=", "1x="]))
    fetch = draw(_fetch())
    plain = ["", "", ":u32", ":s64", ":x8", ":u8"]
    if fetch[0] in "+-":
        plain += [":string", ":ustring", ":u8[2]", ":b3@2/8"]
    return name + fetch + draw(_rarely(plain, [*plain, ":symstr", ":u65", ":string"]))


ARGUMENTS = st.lists(argument(), max_size=3)
