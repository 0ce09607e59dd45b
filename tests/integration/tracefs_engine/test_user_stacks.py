"""`--stack` on uprobes: the kernel's user stack after each event (options/userstacktrace),
printed as the kernel's own `trace` prints it; the ptrace engine refuses it with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from probescope.engines.base import EngineOptions
from probescope.engines.registry import create_engine
from probescope.errors import EngineUnavailable
from probescope.session import Session
from support.witness import record_both, same_but_time

pytestmark = pytest.mark.root


def test_user_stacks_are_printed_as_the_kernel_prints_them(loop: Path) -> None:
    def arm(witness, engine) -> None:  # type: ignore[no-untyped-def]
        witness.set_option("userstacktrace", True)
        witness.enable_group(engine.group)

    ours, expected = record_both(
        [f"{loop}:func_1 a=arg1:s32", f"r:{loop}:func_2 ret=retval:s64"],
        [str(loop), "3", "wait"],
        arm,
        serial=98,
        user_stack=True,
    )
    headers = [line for line in ours if line.endswith(": <user stack trace>")]
    assert len(headers) == 6
    frames = [line for line in ours if line.startswith(" =>  <")]
    assert len(frames) >= 6 and all(len(line) == len(" =>  <0000000000000000>") for line in frames)
    assert same_but_time(ours) == same_but_time(expected)


def test_each_user_stack_follows_its_event(loop: Path) -> None:
    session = Session(
        [f"{loop}:func_1"],
        engine="tracefs",
        command=[str(loop), "4"],
        options=EngineOptions(user_stack=True),
    )
    with session:
        events = list(session.events(duration=30))
    assert [e.name for e in events] == ["func_1", "user_stack"] * 4
    for probe, stack in zip(events[::2], events[1::2], strict=True):
        assert stack.tid == probe.tid and stack.timestamp_ns >= probe.timestamp_ns
        first = int.from_bytes(stack.args[-1][:8], "little")
        assert first == probe.ip  # the unwinder starts at the probed instruction


def test_without_stack_no_user_stacks(loop: Path) -> None:
    session = Session([f"{loop}:func_1"], engine="tracefs", command=[str(loop), "2"])
    with session:
        assert [e.name for e in session.events(duration=30)] == ["func_1"] * 2


@pytest.mark.parametrize("engine", ["ptrace", "fentry"])
def test_engines_without_stack_records_refuse_user_stacks_with_the_reason(
    loop: Path, engine: str
) -> None:
    with pytest.raises(EngineUnavailable) as raised:
        create_engine(engine, options=EngineOptions(user_stack=True))
    assert "records no user stacks" in raised.value.message
    assert "tracefs" in (raised.value.hint or "")
