"""What an aggregation is keyed by: `--by probe,comm,pid,tid,cpu,ARG,retval,ustack,kstack`.

`parse_key_fields` checks the user's list (errors point at the offending name); `KeyPlan`
turns it, for one EventType, into a compiled function from an Event to its key tuple, so the
per-hit work is one call that indexes the Event directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from probescope.aggregate.maps import Key, KeyPart
from probescope.errors import SpecError
from probescope.events import Event, EventType
from probescope.language.model import ProbeKind

BUILTIN_FIELDS = ("probe", "comm", "pid", "tid", "cpu", "retval", "ustack", "kstack")
STACK_FIELDS = ("ustack", "kstack")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FRIENDLY_ARG = re.compile(r"arg[1-9][0-9]*")

_CPU = Event._fields.index("cpu")
_PID = Event._fields.index("pid")
_TID = Event._fields.index("tid")
_COMM = Event._fields.index("comm")
_ARGS = Event._fields.index("args")


def parse_key_fields(text: str, *, option: str = "--by") -> tuple[str, ...]:
    """`comm,pid` → ("comm", "pid"). Names are builtin fields or argument names; each at
    most once."""
    fields: list[str] = []
    column = 0
    for word in text.split(","):
        name = word.strip()
        where = column + (len(word) - len(word.lstrip()))
        if not name:
            raise SpecError(
                f"empty name in {option}", spec=text, column=where, hint="e.g. --by comm,pid"
            )
        if not _NAME.fullmatch(name):
            raise SpecError(
                f"{name!r} is not a key name",
                spec=text,
                column=where,
                hint=f"keys are {', '.join(BUILTIN_FIELDS)} or an argument name of the probes",
            )
        if name in fields:
            raise SpecError(f"key {name!r} is given twice", spec=text, column=where)
        fields.append(name)
        column += len(word) + 1
    return tuple(fields)


def is_argument_field(name: str) -> bool:
    return name not in BUILTIN_FIELDS


def is_friendly_argument(name: str) -> bool:
    """`arg1`, `arg2` ...: the ABI argument, which probescope can fetch for you."""
    return _FRIENDLY_ARG.fullmatch(name) is not None


def probe_label(event_type: EventType) -> str:
    """How a key names a probe: the event name for probes, `system:event` for tracepoints."""
    if event_type.kind is ProbeKind.TRACEPOINT:
        return f"{event_type.group}:{event_type.name}"
    return event_type.name


StackGetter = Callable[[Event], KeyPart]
KeyFunction = Callable[..., Key]
"""`key(event)`; for latency `key(entry, entry, return)` (builtins, arguments, retval)."""


@dataclass(frozen=True)
class KeyPlan:
    """Key fields plus where each argument field is found, per event type."""

    fields: tuple[str, ...]

    @property
    def stack_fields(self) -> tuple[str, ...]:
        return tuple(f for f in self.fields if f in STACK_FIELDS)

    def argument_names(self) -> tuple[str, ...]:
        return tuple(f for f in self.fields if is_argument_field(f))

    def compile(
        self,
        event_type: EventType,
        *,
        label: str | None = None,
        stacks: dict[str, StackGetter] | None = None,
        retval_arg: str | None = None,
        args_from: EventType | None = None,
    ) -> KeyFunction:
        """The function from an Event of `event_type` to its key.

        An argument field missing from the type keys as None. `retval_arg` names the argument
        holding the return value (probescope's hidden one, or the user's). `stacks` supplies
        the getters of `ustack`/`kstack`. `args_from` (latency) says the arguments are read
        from a paired entry event of that type rather than this one.
        """
        namespace: dict[str, object] = {"_label": label or probe_label(event_type)}
        parts = []
        names = (args_from or event_type).arg_names
        for name in self.fields:
            if name == "probe":
                parts.append("_label")
            elif name == "comm":
                parts.append(f"e[{_COMM}]")
            elif name == "pid":
                parts.append(f"e[{_PID}]")
            elif name == "tid":
                parts.append(f"e[{_TID}]")
            elif name == "cpu":
                parts.append(f"e[{_CPU}]")
            elif name in STACK_FIELDS:
                getter = (stacks or {}).get(name)
                if getter is None:
                    parts.append("None")
                else:
                    namespace[f"_{name}"] = getter
                    parts.append(f"_{name}(e)")
            elif name == "retval":
                where = event_type.arg_names
                if retval_arg is not None and retval_arg in where:
                    parts.append(f"r[{_ARGS}][{where.index(retval_arg)}]")
                else:
                    parts.append("None")
            elif name in names:
                parts.append(f"a[{_ARGS}][{names.index(name)}]")
            else:
                parts.append("None")
        body = ", ".join(parts) + ("," if len(parts) == 1 else "")
        if args_from is not None:
            source = f"lambda e, a, r: ({body})"
        else:
            source = f"lambda e, a=None, r=None: ({body})".replace("a[", "e[").replace("r[", "e[")
        return eval(source, namespace)  # type: ignore[no-any-return]


def missing_arguments(fields: Sequence[str], arg_names: Sequence[Sequence[str]]) -> list[str]:
    """Argument fields that no probe's arguments hold."""
    present = {name for names in arg_names for name in names}
    return [f for f in fields if is_argument_field(f) and f not in present]
