"""Which probes the fentry engine takes, grouped per patched function entry, and why it refuses
the others — decided from the files alone, before any process is touched.

One patch serves every probe on a function: entry probes, return probes and the user-space
function tracer (`f:./prog:GLOB`) share its stub, which records once per hit. A probe is refused
when it is not on a function's first instruction, needs memory reads (fetch.py), sits in a Go
binary, or its function cannot be patched (plan.py). If any probe on a function is refused,
every probe on that function is (another engine will put its breakpoint on that entry, which
must not be covered by our jump).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from probescope.engines.fentry.fetch import args_source
from probescope.engines.fentry.plan import SitePlan, plan_entry
from probescope.engines.fentry.relocate import Refused
from probescope.errors import ProbescopeError
from probescope.events import EventType
from probescope.language.model import ArgType, ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import FunctionSpec
from probescope.symbols.entry_sites import EntrySites
from probescope.symbols.function import FunctionSymbol

FileKey = tuple[int, int]  # (device, inode): FileIdentity.key, Mapping.file_key
Facts = Callable[[str], EntrySites]
_HEX64 = ArgType(name="x64", base="x64", size=8, signed=False)


@dataclass
class ProbeUse:
    """One probe served by a site: its event type, how its args come out of a record (a
    tuple expression over the record `r`, `ip` and `comm`, see fetch.py)."""

    probe: ResolvedProbe | None
    event_type: EventType
    source: str  # for one record `r`: uses `FN` (the function's address) and `COMM`
    key: str  # "group/event"


@dataclass
class Group:
    """Every probe on one function entry of one file."""

    file_key: FileKey
    path: str
    plan: SitePlan
    entries: list[ProbeUse] = field(default_factory=list)
    returns: list[ProbeUse] = field(default_factory=list)
    calls: list[ProbeUse] = field(default_factory=list)  # user-space function tracer
    probes: list[ResolvedProbe] = field(default_factory=list)

    @property
    def function(self) -> str:
        return self.plan.function


GroupFor = Callable[[str, FunctionSymbol], Group]


@dataclass
class Catalog:
    groups: dict[FileKey, dict[int, Group]] = field(default_factory=dict)  # by patch offset
    refusals: dict[ResolvedProbe, str] = field(default_factory=dict)
    has_returns: bool = False
    tracer_patterns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def groups_of(self, file_key: FileKey) -> list[Group]:
        return list(self.groups.get(file_key, {}).values())

    @property
    def accepted(self) -> list[ResolvedProbe]:
        return [
            probe
            for by_offset in self.groups.values()
            for group in by_offset.values()
            for probe in group.probes
        ]

    @property
    def site_count(self) -> int:
        return sum(len(by_offset) for by_offset in self.groups.values())


def user_function_pattern(spec: object) -> tuple[str, str] | None:
    """(target, glob) when a function-tracer spec names a user binary (`f:./prog:main*`,
    `f:c:str*`); None for the kernel's patterns (`vfs_*`, `*:mod:ext4`)."""
    if not isinstance(spec, FunctionSpec) or spec.exclude:
        return None
    target, colon, glob = spec.pattern.partition(":")
    if not colon or not target or not glob or glob.startswith("mod:") or glob == "mod":
        return None
    return target, glob


def build_catalog(
    probes: Sequence[ResolvedProbe], *, pid: int | None = None, call_type: EventType | None = None
) -> Catalog:
    """Plan every probe; refused ones land in `refusals` with their reason."""
    catalog = Catalog()
    sites_cache: dict[str, EntrySites] = {}
    planned: dict[tuple[FileKey, int], Group] = {}
    event_types: dict[tuple[str, str], EventType] = {}
    refused_functions: dict[tuple[FileKey, int], str] = {}
    owners: dict[ResolvedProbe, tuple[FileKey, int]] = {}

    def facts(path: str) -> EntrySites:
        if path not in sites_cache:
            sites_cache[path] = EntrySites.for_path(path)
        return sites_cache[path]

    def group_for(path: str, function: FunctionSymbol) -> Group:
        sites = facts(path)
        key: FileKey = sites.identity.key
        place = (key, function.offset)
        if place in refused_functions:
            raise Refused(refused_functions[place])
        group = planned.get(place)
        if group is None:
            try:
                plan = plan_entry(sites, function)
            except Refused as why:
                refused_functions[place] = str(why)
                raise
            group = Group(key, path, plan)
            planned[place] = group
        return group

    for probe in probes:
        try:
            pattern = user_function_pattern(probe.spec)
            if pattern is not None:
                _add_function_tracer(catalog, probe, pattern, pid, group_for, facts, call_type)
                continue
            use, function, path = _probe_use(probe, facts, event_types)
            group = group_for(path, function)
            owners[probe] = (group.file_key, function.offset)
            group.probes.append(probe)
            if probe.kind is ProbeKind.URETPROBE:
                if facts(path).is_go:
                    raise Refused(
                        "return probes on Go binaries are refused: Go moves goroutine stacks"
                    )
                group.returns.append(use)
                catalog.has_returns = True
            else:
                group.entries.append(use)
        except Refused as why:
            catalog.refusals[probe] = str(why)
        except ProbescopeError as error:
            catalog.refusals[probe] = error.message
    # one refused probe on a function sends the others there to the same engine
    for probe, reason in list(catalog.refusals.items()):
        place = owners.pop(probe, None)
        if place is not None:
            refused_functions.setdefault(place, reason)
    # a refused probe inside the bytes a jump would replace takes that function along
    for probe, reason in list(catalog.refusals.items()):
        if probe.path is None or probe.offset is None:
            continue
        try:
            key: FileKey = facts(probe.path).identity.key
        except ProbescopeError:
            continue
        for (group_key, function_offset), group in planned.items():
            plan = group.plan
            if (
                group_key == key
                and plan.patch_offset <= probe.offset < plan.patch_offset + plan.length
            ):
                refused_functions.setdefault(
                    (group_key, function_offset),
                    f"{probe.label} falls back ({reason}) and lies in the {plan.length} bytes "
                    f"the jump at {plan.function} would replace",
                )
    for probe, place in owners.items():
        if place in refused_functions and probe not in catalog.refusals:
            group = planned[place]
            catalog.refusals[probe] = (
                f"another probe on {group.function} falls back ({refused_functions[place]}), "
                "so this one does too: both would patch its entry"
            )
    for (key, offset), group in planned.items():
        if (key, offset) in refused_functions or not group.probes:
            continue
        catalog.groups.setdefault(key, {})[group.plan.patch_offset] = group
    return catalog


def _probe_use(
    probe: ResolvedProbe, facts: Facts, event_types: dict[tuple[str, str], EventType]
) -> tuple[ProbeUse, FunctionSymbol, str]:
    if probe.kind not in (ProbeKind.UPROBE, ProbeKind.URETPROBE):
        raise Refused(f"the fentry engine takes function entries and returns, not {probe.kind}")
    spec = probe.spec
    if not isinstance(spec, ProbeSpec) or probe.path is None or probe.offset is None:
        raise Refused("not a uprobe on a file")
    if probe.ref_ctr_offset:
        raise Refused("a USDT probe with a semaphore (not a function entry)")
    sites = facts(probe.path)
    function = sites.table.function_at_offset(probe.offset)
    if function is None or function.offset != probe.offset:
        raise Refused(
            "not the first instruction of a function: the fentry engine patches function "
            "entries only"
        )
    if sites.is_go:
        raise Refused("a Go binary: goroutine stacks are too small and move (the stub pushes)")
    is_return = probe.kind is ProbeKind.URETPROBE
    source = args_source(spec.args, is_return, ip="r[7]" if is_return else "FN", comm="comms[r[2]]")
    names = (spec.group_name, spec.event_name)
    event_type = event_types.get(names)
    if event_type is None:
        event_type = EventType(
            group=names[0],
            name=names[1],
            kind=probe.kind,
            arg_names=tuple(a.name for a in spec.args),
            arg_types=tuple(a.type for a in spec.args),
        )
        event_types[names] = event_type
    return ProbeUse(probe, event_type, source, f"{names[0]}/{names[1]}"), function, probe.path


def _add_function_tracer(
    catalog: Catalog,
    probe: ResolvedProbe,
    pattern: tuple[str, str],
    pid: int | None,
    group_for: GroupFor,
    facts: Facts,
    call_type: EventType | None,
) -> None:
    from probescope.symbols.locate import locate_binary

    target, glob = pattern
    path = str(locate_binary(target, pid))
    sites = facts(path)
    functions = [
        f
        for f in sites.table.functions
        if any(fnmatch.fnmatchcase(n.split("@")[0], glob) for n in f.names)
    ]
    if not functions:
        raise Refused(f"no function of {path} matches {glob!r}")
    event_type = call_type or function_event_type()
    use = ProbeUse(probe, event_type, "(FN, r[16])", "ftrace/function")
    catalog.tracer_patterns.append(f"{path}:{glob}")
    taken = 0
    skipped: list[str] = []
    for function in functions:
        try:
            group = group_for(path, function)
        except Refused as why:
            skipped.append(str(why))
            continue
        group.calls.append(use)
        if probe not in group.probes:
            group.probes.append(probe)
        taken += 1
    if not taken:
        raise Refused(f"none of the {len(functions)} functions matching {glob!r} can be patched")
    if skipped:
        catalog.notes.append(
            f"f:{target}:{glob}: {len(skipped)} of {len(functions)} functions are not traced "
            f"(first: {skipped[0]})"
        )


def function_event_type(format: object = None) -> EventType:
    """The event type of the user-space function tracer: `func <-parent` lines."""
    return EventType(
        group="ftrace",
        name="function",
        kind=ProbeKind.FUNCTION,
        arg_names=("ip", "parent_ip"),
        arg_types=(_HEX64, _HEX64),
        format=format,
    )
