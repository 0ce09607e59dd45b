"""Filter expressions checked against a real `format` file (sched_switch on 6.18)."""

from __future__ import annotations

import pytest

from probescope.engines.tracefs.filters import check_filter
from probescope.errors import SpecError
from probescope.traceevent.format import parse_event_format

SCHED_SWITCH = """name: sched_switch
ID: 327
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;

print fmt: "prev_comm=%s prev_pid=%d", REC->prev_comm, REC->prev_pid
"""
FORMAT = parse_event_format(SCHED_SWITCH, system="sched")


@pytest.mark.parametrize(
    "expression",
    [
        "prev_pid == 42",
        "prev_pid > 0 && next_pid != 0",
        "(prev_pid == 1 || next_pid == 1) && !(prev_prio < 100)",
        'prev_comm == "bash"',
        'next_comm ~ "py*"',
        "common_pid == 5",
        "prev_state & 1",
        "CPU == 0",
        'COMM ~ "k*"',
        "next_pid >= 0x10",
    ],
)
def test_valid_filters(expression: str) -> None:
    check_filter(expression, FORMAT, spec=expression, column=0)


@pytest.mark.parametrize(
    ("expression", "message", "at"),
    [
        ("prev_pidd == 1", "no field 'prev_pidd'", "prev_pidd"),
        ("prev_pid == 1 && nxt_pid == 2", "no field 'nxt_pid'", "nxt_pid"),
        ("prev_comm > 3", "string field", ">"),
        ('prev_pid == "x"', "compared with a string", '"x"'),
        ('prev_pid ~ "1*"', "glob match", "~"),
        ("prev_pid", "expected a comparison", ""),
        ("prev_pid ==", "missing value", ""),
        ("prev_pid == 1 $", "unexpected character", "$"),
        ("", "empty filter", ""),
    ],
)
def test_bad_filters_point_at_the_problem(expression: str, message: str, at: str) -> None:
    spec = f"t:sched:sched_switch if {expression}"
    column = spec.index(" if ") + 4
    with pytest.raises(SpecError, match=message) as info:
        check_filter(expression, FORMAT, spec=spec, column=column)
    assert info.value.column is not None
    assert spec[info.value.column :].startswith(at)
