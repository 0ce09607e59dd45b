"""One traced address space as the engine set it up, and installing sites into it.

A Family is a ring and what its records mean (site numbers → functions and probes): a process
and its fork children share one, an exec starts a new one. An Image is one process's view:
its code areas and the sites patched in it (a fork child starts as a copy of its parent's).
`install()` runs while every thread is stopped: it creates the ring and thread state on first
use, finds every mapped file with probes or hooks, places stubs in areas within reach, and
writes stubs, site-table rows and finally the jumps — never over a thread stopped inside the
bytes being replaced (those sites are returned, to be retried).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

from probescope.engines.fentry import inject as injecting
from probescope.engines.fentry.area import (
    F_ENTRY,
    F_RETURN,
    CodeArea,
    Owner,
    PlacedSite,
)
from probescope.engines.fentry.catalog import Catalog, FileKey, Group
from probescope.engines.fentry.hooks import HookFinder
from probescope.engines.fentry.plan import SitePlan
from probescope.engines.fentry.relocate import Refused
from probescope.engines.fentry.ring import Ring
from probescope.engines.fentry.world import StoppedProcess
from probescope.engines.ptrace import rendezvous, xol
from probescope.errors import ProbescopeError, PtraceError
from probescope.system import procfs
from probescope.system.maps import Mapping

_CLUSTER = 1 << 30
_SLACK_SITES = 32


@dataclass
class SiteInfo:
    """What the records of one site number mean."""

    number: int
    function_address: int
    group: Group | None
    hook: str | None = None


@dataclass
class Family:
    """A ring, and the site numbers its records carry."""

    ring: Ring
    ring_address: int
    state: int
    sites: list[SiteInfo] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)

    def add_site(self, function_address: int, group: Group | None, hook: str | None) -> int:
        number = len(self.sites)
        self.sites.append(SiteInfo(number, function_address, group, hook))
        return number


@dataclass
class Image:
    """One process's patched state."""

    pid: int
    family: Family | None = None
    areas: list[CodeArea] = field(default_factory=list)
    placed: dict[int, PlacedSite] = field(default_factory=dict)
    rdebug: int = 0
    return_refusal: str | None = None
    refused: set[int] = field(default_factory=set)  # addresses refused at install (noted)

    def fork_copy(self, pid: int) -> Image:
        """The image of a fork child: same family, its own copy of areas and sites."""
        child = Image(pid, self.family, copy.deepcopy(self.areas), {}, self.rdebug)
        child.return_refusal = self.return_refusal
        by_address = {site.address: site for area in child.areas for site in area.sites}
        child.placed = {
            address: by_address.get(address, site) for address, site in self.placed.items()
        }
        child.refused = set(self.refused)
        return child


@dataclass
class _Wanted:
    plan: SitePlan
    address: int
    function_address: int
    flags: int
    group: Group | None
    hook: str | None


class Installer:
    """Installs the catalog's sites and the engine's hooks into stopped processes."""

    def __init__(
        self,
        catalog: Catalog,
        owner: Owner,
        ring_records: int,
        notes: list[str],
    ) -> None:
        self.catalog = catalog
        self.owner = owner
        self.ring_records = ring_records
        self.notes = notes
        self.hooks = HookFinder(unwinder=catalog.has_returns)
        self.injector = xol.SyscallInjector()
        self._ring_serial = 0
        self.patched = {"nop": 0, "detour": 0, "hook": 0}  # sites patched, all processes

    def install(self, world: StoppedProcess, image: Image) -> list[int]:
        """Patch what is mapped and not yet patched; returns addresses to retry (a thread was
        stopped inside their bytes)."""
        mappings = world.space.mappings()
        wanted = self._wanted(world, image, mappings)
        if not wanted:
            return []
        pcs = []
        for thread in world.threads.values():
            try:
                world.registers(thread)
                pcs.append(int(thread.regs.rip))
            except PtraceError:
                continue
        blocked = [
            w.address
            for w in wanted
            if any(w.address < pc < w.address + w.plan.length for pc in pcs)
        ]
        todo = [w for w in wanted if w.address not in blocked]
        if not todo:
            return blocked
        inject = injecting.Injector(world, self.injector)
        try:
            self._place(inject, image, todo)
        finally:
            inject.finish()
        return blocked

    def drop_return_hooks(self, world: StoppedProcess, image: Image) -> None:
        """Rewrite placed stubs without F_RETURN (every thread is stopped, at an instruction
        boundary: a thread about to run a stub's `mov $SITE_WORD` runs the new one)."""
        memory = world.space.memory
        tid = next(iter(world.threads))
        for area in image.areas:
            for site in area.sites:
                if site.word & F_RETURN:
                    site.word &= ~F_RETURN
                    memory.write_code(site.stub, area.stub_code(site), tid)

    # -- what to patch -----------------------------------------------------------------------

    def _wanted(
        self, world: StoppedProcess, image: Image, mappings: list[Mapping]
    ) -> list[_Wanted]:
        pid = world.pid
        exe = _exe_key(pid)
        interpreter_base = procfs.read_auxv(pid).get(procfs.AT_BASE, 0) if _alive(pid) else 0
        if image.rdebug == 0:
            image.rdebug = _rdebug(pid, mappings)
        _forget_unmapped(image, mappings)
        wanted: dict[int, _Wanted] = {}
        for mapping in mappings:
            if not mapping.executable or not mapping.is_file or mapping.path is None:
                continue
            key: FileKey = mapping.file_key
            groups = self.catalog.groups_of(key)
            for group in groups:
                self._want(
                    wanted, image, mapping, group.plan, group, None, _group_flags(group, image)
                )
            is_main = key == exe
            is_interp = bool(interpreter_base) and any(
                m.start == interpreter_base and m.file_key == key for m in mappings
            )
            path = _openable(pid, mapping.path)
            for hook in self.hooks.hooks_for(path, main=is_main, interpreter=is_interp):
                self._want(wanted, image, mapping, hook.plan, None, hook.label, hook.flags)
        self.notes.extend(n for n in self.hooks.notes if n not in self.notes)
        self.hooks.notes.clear()
        return sorted(wanted.values(), key=lambda w: w.address)

    def _want(
        self,
        wanted: dict[int, _Wanted],
        image: Image,
        mapping: Mapping,
        plan: SitePlan,
        group: Group | None,
        hook: str | None,
        flags: int,
    ) -> None:
        if not mapping.contains_file_offset(plan.patch_offset):
            return
        address = mapping.address_of(plan.patch_offset)
        if address in image.placed or address in image.refused:
            return
        if not mapping.contains_file_offset(plan.patch_offset + plan.length - 1):
            return
        function_address = mapping.address_of(plan.function_offset)
        known = wanted.get(address)
        if known is not None:  # a probe and a hook on one function share the site
            known.flags |= flags
            known.group = known.group or group
            known.hook = known.hook or hook
            return
        wanted[address] = _Wanted(plan, address, function_address, flags, group, hook)

    # -- placing and writing -----------------------------------------------------------------

    def _place(self, inject: injecting.Injector, image: Image, todo: list[_Wanted]) -> None:
        memory = inject.world.space.memory
        tid = inject.thread.tid
        fresh_areas: list[CodeArea] = []
        placed: list[tuple[CodeArea, PlacedSite, _Wanted]] = []
        for cluster in _clusters(todo):
            area = next(
                (
                    a
                    for a in image.areas
                    if not a.full
                    and a.reaches(cluster[0].address)
                    and a.reaches(cluster[-1].address)
                ),
                None,
            )
            for item in cluster:
                if area is None or area.full or not area.reaches(item.address):
                    area = self._new_area(inject, image, cluster)
                    if area is None:
                        self._refuse(image, item, "no free address range within 2 GiB of it")
                        continue
                    fresh_areas.append(area)
                family = image.family
                assert family is not None
                number = family.add_site(item.function_address, item.group, item.hook)
                try:
                    site = area.place(
                        item.plan, item.address, item.function_address, number | item.flags
                    )
                except Refused as why:
                    self._refuse(image, item, str(why))
                    continue
                placed.append((area, site, item))
        for area in fresh_areas:
            memory.write_code(area.common, area.common_code(), tid)
        for area, site, _ in placed:
            memory.write_code(site.stub, area.stub_code(site), tid)
            memory.write_code(*area.site_entry(site), tid)
        for area in {id(a): a for a, _, _ in placed}.values():
            memory.write_code(area.start, area.header(), tid)
        written = {id(a) for a, _, _ in placed}
        for area in fresh_areas:
            if id(area) not in written:
                memory.write_code(area.start, area.header(), tid)
        for _, site, item in placed:
            live = memory.read(site.address, site.plan.length)
            if live != site.original:
                self._refuse(
                    image,
                    item,
                    "its bytes in memory differ from the file (another tool patched it, "
                    "or a kernel uprobe is there)",
                )
                continue
            memory.write_code(site.address, site.patch, tid)
            image.placed[site.address] = site
            kind = "hook" if item.group is None else ("nop" if site.plan.nop else "detour")
            self.patched[kind] += 1

    def _refuse(self, image: Image, item: _Wanted, reason: str) -> None:
        image.refused.add(item.address)
        what = item.hook or (item.group.function if item.group else item.plan.function)
        self.notes.append(f"not patched in process {image.pid}: {what}: {reason}")

    def _new_area(
        self, inject: injecting.Injector, image: Image, cluster: list[_Wanted]
    ) -> CodeArea | None:
        low, high = cluster[0].address, cluster[-1].address + 16
        got = injecting.map_area(inject, low, high, len(cluster) + _SLACK_SITES)
        if got is None:
            return None
        start, size = got
        if image.family is None:
            self._new_family(inject, image, start + size - 256)
        family = image.family
        assert family is not None
        trampoline = image.areas[0].own_trampoline if image.areas else None
        area = injecting.new_area(
            start, size, family.ring_address, family.ring.size, family.state,
            self._owner_for(image), image.rdebug, trampoline,
        )  # fmt: skip
        image.areas.append(area)
        return area

    def _new_family(self, inject: injecting.Injector, image: Image, scratch: int) -> None:
        self._ring_serial += 1
        name = f"probescope-fentry-{os.getpid()}-{self._ring_serial}"
        state = injecting.create_state(inject)
        address, ring = injecting.create_ring(inject, scratch, name, self.ring_records)
        inject.world.space.memory.write_code(scratch, b"\0" * 256, inject.thread.tid)
        image.family = Family(ring, address, state, pids={image.pid})

    def _owner_for(self, image: Image) -> Owner:
        visible = injecting.visible_pid(self.owner.pid, image.pid)
        return Owner(visible, self.owner.pid, self.owner.start_time, self.owner.session)


def _forget_unmapped(image: Image, mappings: list[Mapping]) -> None:
    """Sites whose library went away (dlclose): a later load there gets patched anew."""
    for address, site in list(image.placed.items()):
        mapping = next((m for m in mappings if m.start <= address < m.end), None)
        if (
            mapping is None
            or mapping.address_of(site.plan.patch_offset) != address
            or (not mapping.executable)
        ):
            del image.placed[address]
    for address in list(image.refused):
        if not any(m.start <= address < m.end and m.executable for m in mappings):
            image.refused.discard(address)


def _group_flags(group: Group, image: Image) -> int:
    flags = 0
    if group.entries or group.calls:
        flags |= F_ENTRY
    if group.returns and image.return_refusal is None:
        flags |= F_RETURN
    return flags


def _clusters(todo: list[_Wanted]) -> list[list[_Wanted]]:
    clusters: list[list[_Wanted]] = []
    for item in todo:
        if clusters and item.address - clusters[-1][0].address < _CLUSTER:
            clusters[-1].append(item)
        else:
            clusters.append([item])
    return clusters


def _exe_key(pid: int) -> FileKey | None:
    return procfs.executable_key(pid)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _openable(pid: int, path: str) -> str:
    """The mapped file as this process can open it (through the program's root)."""
    rooted = f"/proc/{pid}/root{path}"
    return rooted if os.path.exists(rooted) and not os.path.exists(path) else path


def _rdebug(pid: int, mappings: list[Mapping]) -> int:
    """The address of the dynamic linker's r_debug (0: unknown; the hook then asks at every
    state change instead of only at RT_CONSISTENT)."""
    try:
        auxv = procfs.read_auxv(pid)
    except (OSError, ProbescopeError):
        return 0
    found = rendezvous.from_interpreter(pid, auxv, mappings)
    return found.r_debug if found is not None and found.r_debug else 0
