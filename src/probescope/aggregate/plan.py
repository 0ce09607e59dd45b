"""From a request to what a run installs: the key fields, the probes with the hidden arguments
their keys and values need, the entry/return pairs of a latency, and how stacks are captured.

Hidden arguments: an ABI argument the spec did not fetch (`argN` at a function's entry, read as
a 64-bit register like bpftrace's `arg0`), the return value (`__ps_retval`), the stack pointer
that pairs entries with returns (`__ps_sp`), and a copy of the stack (`stack_capture`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from probescope.aggregate.aggregators import StackOptions
from probescope.aggregate.keys import (
    BUILTIN_FIELDS,
    KeyPlan,
    is_argument_field,
    is_friendly_argument,
    missing_arguments,
)
from probescope.aggregate.latency import RETURN_VALUE, STACK_POINTER
from probescope.aggregate.stack_capture import (
    MAX_SNAPSHOT,
    StackCapture,
    with_arguments,
    with_stack_capture,
)
from probescope.aggregate.values import Scale
from probescope.errors import ProbescopeError, SpecError
from probescope.language.arch import Arch
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.parse import Spec
from probescope.language.resolved import ResolvedProbe

KINDS = ("count", "hist", "latency", "stacks")
RETURN_SUFFIX = "__return"


class AggregationError(ProbescopeError):
    """A request that cannot be aggregated (a key no probe has, a return probe for latency)."""


@dataclass(frozen=True)
class Request:
    """What to aggregate: `kind` (count, hist, latency, stacks) of the probes `specs`, keyed by
    `by`; `of` is the argument a histogram is made of, `scale` its buckets; `unit` the latency
    unit; `stack_method`/`stack_size` how user stacks are captured; `keep_spans` keeps every
    timed call for an evented profile."""

    kind: str
    specs: tuple[str | Spec, ...]
    by: tuple[str, ...] | None = None
    of: str | None = None
    scale: Scale | None = None
    unit: str = "us"
    stack_method: str = "dwarf"
    stack_size: int = MAX_SNAPSHOT
    keep_spans: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise AggregationError(f"unknown aggregation {self.kind!r}")
        if self.kind == "hist" and not self.of:
            raise AggregationError("a histogram needs the argument it is made of", hint="--of ARG")


@dataclass
class Plan:
    """What a run installs and how it keys: `fields` (KeyPlan `keys`), the prepared `probes`,
    `returns` (return event name → entry event name, for latency), `stacks` options;
    `in_kernel` when the engine aggregates in the kernel."""

    request: Request
    engine: str
    arch: Arch
    fields: tuple[str, ...] = ()
    probes: list[ResolvedProbe] = field(default_factory=list)
    returns: dict[str, str] = field(default_factory=dict)
    stacks: StackOptions = field(default_factory=StackOptions)
    in_kernel: bool = False

    @property
    def keys(self) -> KeyPlan:
        return KeyPlan(self.fields)


def plan_request(
    request: Request,
    resolved: list[ResolvedProbe],
    *,
    engine: str,
    arch: Arch,
    in_kernel: bool = False,
) -> Plan:
    """The plan of `request` over its resolved probes for the engine that will run them;
    `in_kernel`: the engine aggregates in the kernel, so the probes fetch only what keys and
    values are made of (no stack copies, no stack pointer for pairing)."""
    if not resolved:
        raise AggregationError("no probes to aggregate", hint="give at least one probe spec")
    planner = _Planner(Plan(request, engine, arch, in_kernel=in_kernel))
    plan = planner.plan
    plan.fields = key_fields(request, resolved)
    plan.stacks = StackOptions(
        method=request.stack_method,
        kernel_user_walk=(
            request.stack_method == "fp"
            and engine == "tracefs"
            and request.kind != "latency"
            and not in_kernel
        ),
        kernel_stacks="kstack" in plan.fields,
    )
    plan.probes = planner._prepare(resolved)
    plan.stacks.at_function_entry = {
        p.spec.event_name: p.on_function_entry for p in plan.probes if isinstance(p.spec, ProbeSpec)
    }
    return plan


def key_fields(request: Request, probes: Sequence[ResolvedProbe]) -> tuple[str, ...]:
    """The key of the request's values: `by`, or the default of its kind (the probe when
    there are several; stacks: the user stack for user probes, else the kernel's)."""
    if request.by is not None:
        return request.by
    several = len({_event_name(p) for p in probes}) > 1
    if request.kind == "stacks":
        user = any(p.kind.is_user for p in probes)
        stack = ("ustack",) if user else ("kstack",)
        return (("probe",) if several else ()) + stack
    if request.kind == "count":
        return ("probe",)
    return ("probe",) if several else ()


class _Planner:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.request = plan.request
        self.arch = plan.arch

    @property
    def fields(self) -> tuple[str, ...]:
        return self.plan.fields

    @property
    def returns(self) -> dict[str, str]:
        return self.plan.returns

    @property
    def stack_options(self) -> StackOptions:
        return self.plan.stacks

    def _prepare(self, probes: list[ResolvedProbe]) -> list[ResolvedProbe]:
        request = self.request
        fields = self.fields
        wanted = [f for f in fields if is_argument_field(f)]
        if request.of:
            wanted.append(request.of)
        if request.kind == "latency":
            probes = self._latency_probes(probes)
        prepared = []
        capture = StackCapture(
            request.stack_method,
            request.stack_size,
            kernel_walk=self.stack_options.kernel_user_walk,
        )
        for probe in probes:
            spec = probe.spec
            extra = []
            if isinstance(spec, ProbeSpec):
                names = {a.name for a in spec.args}
                for name in wanted:
                    if name in names or not is_friendly_argument(name):
                        continue
                    fetch = self._friendly_argument(probe, name)
                    if fetch is not None:
                        extra.append(f"{name}={fetch}:s64")
                if spec.kind.is_return and "retval" in fields:
                    extra.append(f"{RETURN_VALUE}=$retval:s64")
                if spec.kind.is_return and request.of == "retval" and "retval" not in names:
                    extra.append("retval=$retval:s64")  # the value is an argument by that name
                if request.kind == "latency" and not self.plan.in_kernel:
                    extra.append(f"{STACK_POINTER}=%sp:x64")
            probe = with_arguments(probe, extra, arch=self.arch)
            copies_stack = "ustack" in fields and not self.plan.in_kernel  # else the kernel walks
            if copies_stack and not (request.kind == "latency" and probe.kind.is_return):
                probe = with_stack_capture(probe, capture, arch=self.arch)
            prepared.append(probe)
        self._check_fields(prepared)
        return prepared

    def _friendly_argument(self, probe: ResolvedProbe, name: str) -> str | None:
        """`argN` lowered for this probe: only at a function's entry, where the ABI holds."""
        if not probe.on_function_entry or probe.kind is not ProbeKind.UPROBE:
            return None
        index = int(name[3:])
        register = self.arch.arg_register(index)
        if register is not None:
            return f"%{register}"
        return f"$stack{index - len(self.arch.arg_registers)}"

    def _latency_probes(self, probes: list[ResolvedProbe]) -> list[ResolvedProbe]:
        result = []
        for probe in probes:
            spec = probe.spec
            text = spec.source if isinstance(spec, ProbeSpec) and spec.source else str(spec)
            if not isinstance(spec, ProbeSpec) or spec.kind not in (
                ProbeKind.UPROBE,
                ProbeKind.KPROBE,
            ):
                raise SpecError(
                    f"latency needs a function entry, not a {probe.kind} probe",
                    spec=text,
                    column=0,
                    hint="give the function (e.g. c:malloc): the return probe is made for you",
                )
            if spec.kind is ProbeKind.UPROBE and not probe.on_function_entry:
                raise SpecError(
                    "latency needs the first instruction of a function",
                    spec=text,
                    column=0,
                    hint="a return probe only pairs with an entry at the function's start",
                )
            entry_name = spec.event_name
            return_name = entry_name[: 63 - len(RETURN_SUFFIX)] + RETURN_SUFFIX
            return_kind = (
                ProbeKind.URETPROBE if spec.kind is ProbeKind.UPROBE else ProbeKind.KRETPROBE
            )
            returning = replace(spec, kind=return_kind, event=return_name, args=(), source=None)
            self.returns[return_name] = entry_name
            result += [
                replace(probe, spec=replace(spec, event=entry_name)),
                replace(probe, spec=returning, kind=return_kind),
            ]
        return result

    def _check_fields(self, probes: list[ResolvedProbe]) -> None:
        arg_names = [
            [a.name for a in p.spec.args] if isinstance(p.spec, ProbeSpec) else [] for p in probes
        ]
        if any(not isinstance(p.spec, ProbeSpec) for p in probes):
            return  # tracepoint fields are known only once their formats are read
        missing = missing_arguments(self.fields, arg_names)
        if self.request.of and self.request.of not in {n for ns in arg_names for n in ns}:
            missing.append(self.request.of)
        if missing == ["retval"] and self.request.of == "retval":
            raise AggregationError(
                "--of retval needs a return probe: no probe given returns",
                hint="probe the return (e.g. 'r:c:malloc' or 'c:malloc%return')",
            )
        if missing:
            raise AggregationError(
                f"no probe has an argument named {missing[0]!r}",
                hint=f"keys are {', '.join(BUILTIN_FIELDS)}, argN at a function entry, or an "
                "argument the spec names (e.g. 'c:malloc size=arg1:u64' gives 'size')",
            )


def _event_name(probe: ResolvedProbe) -> str:
    spec = probe.spec
    return spec.event_name if isinstance(spec, ProbeSpec) else str(spec)
