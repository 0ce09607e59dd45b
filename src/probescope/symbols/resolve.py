"""From specs to ResolvedProbes: locate the target, look up symbols, compute and check file
offsets, and lower friendly specs into kernel-grammar ProbeSpecs.

Every spec is parsed (arguments included) before any target is located; every problem of every
spec is collected before failing, and each is reported against the spec's own text with a caret.
What a glob skips (an IFUNC whose implementation cannot be known here) is said in `notes`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from probescope.errors import ProbescopeError, SpecError, SpecErrors, SymbolError
from probescope.language.arch import Arch, host_arch
from probescope.language.event_names import (
    demangled_event_base,
    event_name_for,
    first_free,
    numbered,
)
from probescope.language.fetchargs import LATEST, ParseFlags, parse_fetcharg
from probescope.language.friendly import FriendlyProbe, lower_args
from probescope.language.kernel_features import KernelGrammar
from probescope.language.model import DeleteSpec, FetchArg, ProbeKind, ProbeSpec, UprobeLocation
from probescope.language.parse import Spec, parse_probe
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import FunctionSpec, TracepointSpec
from probescope.language.usdt_spec import UsdtSpec
from probescope.symbols.function import FunctionSymbol
from probescope.symbols.locate import locate_binary
from probescope.symbols.table import SymbolTable

if TYPE_CHECKING:
    from probescope.symbols.usdt import UsdtSite


def resolve_specs(
    specs: Sequence[str | Spec],
    *,
    pid: int | None = None,
    arch: Arch | None = None,
    grammar: KernelGrammar = LATEST,
    notes: list[str] | None = None,
) -> list[ResolvedProbe]:
    """Parse (if text) and resolve every spec; raises one SpecErrors listing all problems.

    `grammar` is what the kernel the probes are meant for accepts (KernelGrammar.for_release);
    `notes` receives one line per thing a glob left out, and why.
    """
    arch = arch or host_arch()
    parsed: list[tuple[Spec | None, list[SpecError]]] = []
    for item in specs:  # parse everything before locating anything
        problems: list[SpecError] = []
        spec: Spec | None = item if not isinstance(item, str) else None
        if isinstance(item, str):
            try:
                spec = parse_probe(item, arch=arch, grammar=grammar, diagnostics=problems)
            except SpecError as error:
                problems += _each(error)
        parsed.append((spec, problems))
    resolved: list[ResolvedProbe] = []
    errors: list[SpecError] = []
    for spec, problems in parsed:
        errors += problems  # a spec's own parse errors, then what locating it finds
        if spec is None:
            continue
        try:
            found = resolve(spec, pid=pid, arch=arch, grammar=grammar, notes=notes)
        except SpecError as error:
            errors += _each(error)
        except ProbescopeError as error:
            text = getattr(spec, "source", None) or str(spec)
            errors.append(SpecError(error.message, spec=text, hint=error.hint))
        else:
            resolved += found
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return _unique_event_names(resolved)


def _each(error: SpecError) -> list[SpecError]:
    return list(error.errors) if isinstance(error, SpecErrors) else [error]


def resolve(
    spec: Spec,
    *,
    pid: int | None = None,
    arch: Arch | None = None,
    grammar: KernelGrammar = LATEST,
    notes: list[str] | None = None,
) -> list[ResolvedProbe]:
    arch = arch or host_arch()
    if isinstance(spec, DeleteSpec):
        raise SpecError(
            "a delete command is not a probe",
            spec=spec.source or str(spec),
            column=0,
            hint="probescope removes its own events when the session ends",
        )
    if isinstance(spec, FriendlyProbe):
        return _resolve_friendly(spec, pid, arch, grammar, notes)
    if isinstance(spec, TracepointSpec | FunctionSpec):
        return [ResolvedProbe(spec=spec, kind=spec.kind)]
    if isinstance(spec, UsdtSpec):
        return _resolve_usdt(spec, pid, arch, grammar)
    if spec.kind.is_user:
        return [_resolve_kernel_uprobe(spec)]
    return [ResolvedProbe(spec=spec, kind=spec.kind, symbol=_kernel_symbol(spec))]


def _kernel_symbol(spec: ProbeSpec) -> str | None:
    return getattr(spec.location, "symbol", None)


def _resolve_kernel_uprobe(spec: ProbeSpec) -> ResolvedProbe:
    """A kernel-grammar uprobe: the offset is the user's; check it is a safe place anyway."""
    location = spec.location
    assert isinstance(location, UprobeLocation)
    text = spec.source or str(spec)
    column = text.find(location.path) if location.path in text else None
    if not os.path.isfile(location.path):
        raise SpecError(
            f"{location.path!r} is not a regular file",
            spec=text,
            column=column,
            hint="the kernel resolves the path in probescope's mount namespace",
        )
    table = _table(location.path, text, column)
    function = table.function_at_offset(location.offset)
    from probescope.symbols.insn import check_probe_offset

    try:
        check_probe_offset(location.path, location.offset, function)
    except SymbolError as error:
        offset_column = None if column is None else column + len(location.path) + 1
        raise SpecError(error.message, spec=text, column=offset_column, hint=error.hint) from None
    return _resolved(spec, location.path, location.offset, function, location.ref_ctr_offset, table)


def _table(path: str, text: str, column: int | None) -> SymbolTable:
    try:
        return SymbolTable.for_path(path)
    except SymbolError as error:
        raise SpecError(error.message, spec=text, column=column, hint=error.hint) from None


def _resolve_friendly(
    probe: FriendlyProbe,
    pid: int | None,
    arch: Arch,
    grammar: KernelGrammar,
    notes: list[str] | None = None,
) -> list[ResolvedProbe]:
    text = probe.source
    try:
        path = str(locate_binary(probe.target, pid))
    except SymbolError as error:
        raise SpecError(
            error.message, spec=text, column=probe.target_column, hint=error.hint
        ) from None
    table = _table(path, text, probe.target_column)

    def at_symbol(error: SymbolError) -> SpecError:
        return SpecError(error.message, spec=text, column=probe.symbol_column, hint=error.hint)

    functions: list[FunctionSymbol | None]
    try:
        if probe.symbol is None:
            functions = [table.function_at_offset(probe.offset)]
        elif probe.is_glob:
            matched = table.match(probe.symbol)
            if not matched:
                raise SymbolError(
                    f"no function of {path} matches {probe.symbol!r}",
                    hint=f"list them with: probescope symbols {probe.target} '{probe.symbol}'",
                )
            functions = list(matched)
        else:
            functions = [table.lookup(probe.symbol)]
    except SymbolError as error:
        raise at_symbol(error) from None

    resolved = []
    skipped: list[str] = []
    for function in functions:
        if function is not None and function.is_ifunc:
            from probescope.symbols.ifunc import resolve_ifunc

            try:
                function = resolve_ifunc(path, function, table)
            except SymbolError as error:
                if not probe.is_glob:
                    raise at_symbol(error) from None
                skipped.append(f"{function.display_name} ({error.message.rsplit(': ', 1)[-1]})")
                continue
        offset = probe.offset if function is None else function.offset + probe.offset
        if probe.symbol is None or probe.offset:
            from probescope.symbols.insn import check_probe_offset

            try:
                check_probe_offset(path, offset, function)
            except SymbolError as error:
                raise at_symbol(error) from None
        on_entry = function is not None and offset == function.offset
        go_abi = function is not None and table.takes_go_registers(function)
        args = lower_args(probe, arch, on_entry=on_entry, go_abi=go_abi)
        event = probe.event
        if event is None and function is not None:
            event = event_name_for(_event_base(table, function), probe.offset, probe.is_return)
        spec = ProbeSpec(
            kind=probe.kind,
            location=UprobeLocation(path, offset),
            group=probe.group,
            event=event,
            args=args,
            filter=probe.filter,
            source=text,
        )
        resolved.append(_resolved(spec, path, offset, function, None, table))
    if skipped:
        message = (
            f"{text}: skipped {len(skipped)} IFUNC{'s' if len(skipped) > 1 else ''} whose "
            f"implementation cannot be known here: {', '.join(skipped[:5])}"
            + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        )
        if not resolved:
            raise at_symbol(SymbolError(message, hint="probe the implementations by name"))
        if notes is not None:
            notes.append(message)
    return resolved


def _event_base(table: SymbolTable, function: FunctionSymbol) -> str:
    """What a derived event name starts from: a C++/Rust function's demangled qualified name
    (`ns::Class::method` → `ns_Class_method`), else the symbol itself."""
    if not function.name.startswith(("_Z", "_R")):
        return function.name
    demangled = table.demangled_name(function)
    if demangled == function.display_name:
        return function.name
    from probescope.symbols.demangle import function_path

    return demangled_event_base(function_path(demangled.split("@", 1)[0]))


def _resolve_usdt(
    spec: UsdtSpec, pid: int | None, arch: Arch, grammar: KernelGrammar
) -> list[ResolvedProbe]:
    """One uprobe per call site at `PATH:PC(SEMAPHORE)`; sites whose arguments have the same
    names and types share one event (the kernel appends probe points to it)."""
    text = spec.source or str(spec)
    try:
        path = str(locate_binary(spec.target, pid))
    except SymbolError as error:
        raise SpecError(
            error.message, spec=text, column=spec.target_column, hint=error.hint
        ) from None
    from probescope.symbols.usdt import find_usdt

    try:
        probes = find_usdt(path, spec.provider, spec.name)
    except SymbolError as error:
        raise SpecError(
            error.message, spec=text, column=spec.probe_column, hint=error.hint
        ) from None
    flags = ParseFlags(user=True, grammar=grammar)
    resolved = []
    for usdt in probes:
        base = event_name_for(f"{usdt.provider}_{usdt.name}", 0, False)
        names: dict[tuple[str, ...], str] = {}
        for site in usdt.sites:
            args = tuple(
                _usdt_fetcharg(fetch, i, column, text, flags, arch)
                for i, (fetch, column) in enumerate(_usdt_fetchargs(spec, site, text))
            )
            signature = tuple(f"{a.name}:{a.type}" for a in args)
            event = names.setdefault(signature, numbered(base, len(names)) if names else base)
            probe_spec = ProbeSpec(
                kind=ProbeKind.UPROBE,
                location=UprobeLocation(path, site.pc_offset, site.semaphore_offset),
                event=event,
                args=args,
                filter=spec.filter,
                source=text,
            )
            stat = os.stat(path)
            resolved.append(
                ResolvedProbe(
                    spec=probe_spec,
                    kind=ProbeKind.USDT,
                    path=path,
                    offset=site.pc_offset,
                    ref_ctr_offset=site.semaphore_offset,
                    symbol=f"{usdt.provider}:{usdt.name}",
                    vaddr=site.pc,
                    device=stat.st_dev,
                    inode=stat.st_ino,
                )
            )
    return resolved


def _usdt_fetcharg(
    fetch: str, index: int, column: int, text: str, flags: ParseFlags, arch: Arch
) -> FetchArg:
    """One USDT argument as the note's operand gives it; a problem is reported at the user's
    text (`column`), quoting the fetch made from the note."""
    try:
        return parse_fetcharg(fetch, index, flags=flags, arch=arch, spec=fetch)
    except SpecError as error:
        raise SpecError(
            f"{fetch!r} (from the probe's note): {error.message}",
            spec=text,
            column=column,
            hint=error.hint,
        ) from None


def _usdt_fetchargs(spec: UsdtSpec, site: UsdtSite, text: str) -> list[tuple[str, int]]:
    """The fetch text of each argument, each with the column of the spec it comes from."""
    if not spec.args:
        try:
            return [(fetch, spec.probe_column) for fetch in site.fetchargs()]
        except SymbolError as error:
            raise SpecError(
                error.message, spec=text, column=spec.probe_column, hint=error.hint
            ) from None
    chosen = []
    for choice in spec.args:
        if choice.index > len(site.args):
            raise SpecError(
                f"the probe has {len(site.args)} arguments, not {choice.index}",
                spec=text,
                column=choice.column,
            )
        argument = site.args[choice.index - 1]
        fetch = argument.fetch_as(choice.type) if choice.type else argument.fetcharg
        if fetch is None:
            raise SpecError(
                f"arg{choice.index} ({argument.text!r}) cannot be fetched"
                + (f" as {choice.type}" if choice.type else "")
                + (f": {argument.problem}" if argument.problem else ""),
                spec=text,
                column=choice.column,
            )
        chosen.append((f"{choice.name}={fetch}", choice.column))
    return chosen


def _resolved(
    spec: ProbeSpec,
    path: str,
    offset: int,
    function: FunctionSymbol | None,
    ref_ctr_offset: int | None,
    table: SymbolTable,
) -> ResolvedProbe:
    """The probe at `offset`, checked to be an instruction boundary (or a function's entry)."""
    stat = os.stat(path)
    return ResolvedProbe(
        spec=spec,
        kind=spec.kind,
        path=path,
        offset=offset,
        ref_ctr_offset=ref_ctr_offset,
        symbol=table.demangled_name(function) if function else None,
        symbol_offset=offset - function.offset if function else 0,
        function_offset=function.offset if function else None,
        function_size=function.size if function else None,
        vaddr=(function.vaddr + offset - function.offset) if function else None,
        device=stat.st_dev,
        inode=stat.st_ino,
        boundary_checked=True,
        go_binary=table.is_go,
    )


def _unique_event_names(probes: list[ResolvedProbe]) -> list[ResolvedProbe]:
    """Derived names that collide (same function name in two libraries, aliases in a glob) get
    a numeric suffix; names the user chose are kept, so repeating one appends probe points to
    one event the way the kernel does."""
    taken: dict[str, set[str]] = {}
    result = []
    for probe in probes:
        spec = probe.spec
        if not isinstance(spec, ProbeSpec):
            result.append(probe)
            continue
        names = taken.setdefault(spec.group_name, set())
        user_named = spec.kind in (ProbeKind.UPROBE, ProbeKind.URETPROBE) and _user_named(spec)
        name = spec.event_name if user_named else first_free(spec.event_name, names)
        if name != spec.event_name:
            probe = replace(probe, spec=replace(spec, event=name))
        names.add(name)
        result.append(probe)
    return result


def _user_named(spec: ProbeSpec) -> bool:
    source = spec.source or ""
    first = source.split(None, 1)[0] if source.strip() else ""
    return first[:1] in ("p", "r") and first[1:2] == ":" and first.count(":") == 1
