"""The engine's own hooks in a traced program: the places where it must act before the program
goes on, or where hijacked return addresses must not be seen.

- the dynamic linker's rendezvous (`_dl_debug_state`, r_brk): at RT_CONSISTENT new libraries
  are mapped but none of their code ran; the stub asks the tracer (a handshake) to patch them;
- exec (`execve`, `execveat`, `fexecve` in libc, or in a static executable): the stub asks the
  tracer to follow the exec, so the new image is set up at its exec stop;
- the unwinder (`_Unwind_RaiseException` and friends, `__cxa_begin_catch`), only when return
  probes are in use: an exception starting puts every real return address back, a catch hooks
  the surviving frames again (as the ptrace engine does, mechanisms.md §4.5).
A hook that cannot be patched is noted with its reason (what it protects then does not work).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from probescope.engines.fentry.area import F_CATCH, F_DLOPEN, F_EXEC, F_EXPOSE
from probescope.engines.fentry.plan import SitePlan, plan_entry
from probescope.engines.fentry.relocate import Refused
from probescope.errors import ProbescopeError
from probescope.symbols.entry_sites import EntrySites

DLOPEN_FUNCTION = "_dl_debug_state"
EXEC_FUNCTIONS = ("execve", "execveat", "fexecve")
EXPOSE_FUNCTIONS = (
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
)
CATCH_FUNCTIONS = ("__cxa_begin_catch",)
_UNWINDER_LIBRARIES = ("libgcc_s", "libstdc++", "libc++abi", "libunwind")
_FLAG_NAMES = {F_DLOPEN: "dlopen", F_EXEC: "exec", F_EXPOSE: "unwind", F_CATCH: "catch"}


@dataclass(frozen=True)
class HookPlan:
    plan: SitePlan
    flags: int

    @property
    def label(self) -> str:
        kinds = [name for flag, name in _FLAG_NAMES.items() if self.flags & flag]
        return f"{self.plan.function} ({', '.join(kinds)} hook)"


class HookFinder:
    """Hook plans per file, computed once per file."""

    def __init__(self, *, unwinder: bool) -> None:
        self.unwinder = unwinder
        self._cache: dict[tuple[str, bool, bool], list[HookPlan]] = {}
        self.notes: list[str] = []

    def hooks_for(self, path: str, *, main: bool, interpreter: bool) -> list[HookPlan]:
        key = (path, main, interpreter)
        if key not in self._cache:
            self._cache[key] = self._find(path, main=main, interpreter=interpreter)
        return self._cache[key]

    def _find(self, path: str, *, main: bool, interpreter: bool) -> list[HookPlan]:
        name = os.path.basename(path)
        wanted: list[tuple[str, int]] = []
        if interpreter or name.startswith("ld-linux"):
            wanted.append((DLOPEN_FUNCTION, F_DLOPEN))
        if main or name.startswith("libc.so"):
            wanted += [(function, F_EXEC) for function in EXEC_FUNCTIONS]
        if self.unwinder and (main or name.startswith(_UNWINDER_LIBRARIES)):
            wanted += [(function, F_EXPOSE) for function in EXPOSE_FUNCTIONS]
            wanted += [(function, F_CATCH) for function in CATCH_FUNCTIONS]
        if not wanted:
            return []
        try:
            sites = EntrySites.for_path(path)
        except ProbescopeError:
            return []
        plans: list[HookPlan] = []
        for function_name, flags in wanted:
            try:
                function = sites.table.lookup(function_name)
            except ProbescopeError:
                continue
            if function.offset == 0:
                continue
            try:
                plans.append(HookPlan(plan_entry(sites, function, hook=True), flags))
            except Refused as why:
                kind = _FLAG_NAMES[flags]
                self.notes.append(f"cannot hook {function_name} in {path} ({kind}): {why}")
        return plans
