"""Putting breakpoints into an address space: probes of every mapped file that matches, the
dynamic linker's rendezvous, the unwinder hooks, their XOL slots and the return trampoline.

Used at the exec stop (or attach), at each RT_CONSISTENT of the rendezvous (dlopen/dlclose) and,
for loaders without a rendezvous, on a maps rescan at other stops.
"""

from __future__ import annotations

import time

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import rendezvous, xol
from probescope.engines.ptrace.insn_x86_64 import analyze
from probescope.engines.ptrace.tracee import (
    Breakpoint,
    Counters,
    ProbeSite,
    Thread,
    TracerOptions,
)
from probescope.engines.ptrace.xol import SyscallInjector
from probescope.errors import ProcessError, PtraceError
from probescope.symbols.maps import mapped_file
from probescope.symbols.unwinder import may_hold_unwinder, unwinder_entry_points
from probescope.system import procfs
from probescope.system.maps import Mapping

_SCAN_INTERVAL = 1.0


class Installer:
    """Inserts and forgets breakpoints as files come and go in the tracees' address spaces."""

    def __init__(
        self,
        sites: list[ProbeSite],
        options: TracerOptions,
        counters: Counters,
        injector: SyscallInjector,
    ) -> None:
        self.sites_by_file: dict[tuple[int, int], list[ProbeSite]] = {}
        for site in sites:
            self.sites_by_file.setdefault(site.file_key, []).append(site)
        self.has_return_sites = any(s.is_return for s in sites)
        self.options = options
        self.counters = counters
        self.injector = injector

    def prepare(self, thread: Thread, *, at_exec: bool) -> None:
        process = thread.process
        mappings = process.mappings()
        process.last_scan = time.monotonic()
        if self.has_return_sites:
            process.return_refusal = self.return_refusal(thread)
        self.apply(thread, mappings, strict=True)
        self.install_rendezvous(thread, mappings)

    def return_refusal(self, thread: Thread) -> str | None:
        if procfs.shadow_stack_enabled(thread.tid):
            return (
                f"return probes disabled in process {thread.tgid}: x86 user shadow stack "
                "(CET shstk) is enabled and a hijacked return address would fault"
            )
        return None

    def apply(self, thread: Thread, mappings: list[Mapping], *, strict: bool = False) -> None:
        """Insert every probe whose file is mapped and not yet probed; forget breakpoints whose
        mapping went away (dlclose)."""
        process = thread.process
        wanted: list[tuple[Mapping, int, list[ProbeSite]]] = []
        live: set[int] = set()
        for mapping in mappings:
            if not mapping.executable or not mapping.inode:
                continue
            sites = self.sites_by_file.get(mapping.file_key)
            if not sites:
                continue
            by_offset: dict[int, list[ProbeSite]] = {}
            for site in sites:
                if mapping.contains_file_offset(site.offset):
                    by_offset.setdefault(site.offset, []).append(site)
            for offset, group in by_offset.items():
                address = mapping.address_of(offset)
                live.add(address)
                existing = process.breakpoints.get(address)
                if existing is not None and existing.file_offset == offset:
                    continue
                wanted.append((mapping, offset, group))
        for address, bp in list(process.breakpoints.items()):
            if bp.internal is None and address not in live:
                del process.breakpoints[address]
        if self.has_return_sites:
            self.hook_unwinders(thread, mappings)
        if not wanted:
            return
        if self.has_return_sites and process.trampoline is None:
            self.make_trampoline(thread, wanted[0][0])
        by_mapping: dict[int, list[tuple[Mapping, int, list[ProbeSite]]]] = {}
        for item in wanted:
            by_mapping.setdefault(item[0].start, []).append(item)
        for items in by_mapping.values():
            for mapping, offset, group in items:
                try:
                    self.insert(
                        thread, mapping, mapping.address_of(offset), offset, group, len(items)
                    )
                except PtraceError as error:
                    if strict:
                        raise
                    self.counters.notes.append(error.message)
                    continue
                self.count_semaphore(thread, mappings, mapping.file_key, group)

    def insert(
        self,
        thread: Thread,
        mapping: Mapping,
        address: int,
        offset: int,
        sites: list[ProbeSite] | None,
        batch: int = 1,
        internal: str | None = None,
    ) -> Breakpoint:
        process = thread.process
        code = process.memory.read(address, arch.MAX_INSTRUCTION + 1)
        if not code:
            raise PtraceError(f"cannot read the instruction at 0x{address:x} in {thread.tgid}")
        instruction = analyze(code, address)
        bp = Breakpoint(
            address=address,
            file_offset=offset,
            instruction=instruction,
            internal=internal,
            mapping_key=mapping.file_key,
        )
        for site in sites or []:
            (bp.return_sites if site.is_return else bp.entry_sites).append(site)
        slot = self.slot(thread, address, batch)
        code_in_slot = None if self.options.single_step else instruction.slot_code(slot)
        if code_in_slot is None:
            bp.single_step = True
            bp.step_plan = instruction.step_plan()
            bp.step_slot = slot
            code_in_slot = bp.step_plan.code
        else:
            bp.slot = slot
        process.memory.write_code(slot, code_in_slot, thread.tid)
        process.breakpoints[address] = bp
        process.memory.write_code(address, arch.BREAKPOINT, thread.tid)
        self.counters.breakpoints += 1
        return bp

    def count_semaphore(
        self,
        thread: Thread,
        mappings: list[Mapping],
        key: tuple[int, int],
        sites: list[ProbeSite],
    ) -> None:
        """Add 1 to the USDT semaphore of a probe site (once per site and process, like the
        kernel's update_ref_ctr), in the file's private writable mapping."""
        ref = next((s.probe.ref_ctr_offset for s in sites if s.probe.ref_ctr_offset), None)
        if ref is None:
            return
        data = next(
            (
                m
                for m in mappings
                if m.file_key == key and m.writable and m.private and m.contains_file_offset(ref)
            ),
            None,
        )
        if data is None:
            self.counters.notes.append(
                f"semaphore at file offset 0x{ref:x} not mapped writable in {thread.tgid}"
            )
            return
        address = data.address_of(ref)
        if thread.process.memory.add_u16(address, 1):
            process = thread.process
            process.semaphores[address] = process.semaphores.get(address, 0) + 1

    def hook_unwinders(self, thread: Thread, mappings: list[Mapping]) -> None:
        """Breakpoints where exception unwinding starts and where it is caught (returns.py)."""
        process = thread.process
        main_key = procfs.executable_key(thread.tgid)
        root: str | None = None
        for mapping in mappings:
            key = mapping.file_key
            if not mapping.executable or not mapping.inode or key in process.unwinder_checked:
                continue
            if mapping.path is None or not may_hold_unwinder(mapping.path, key == main_key):
                continue
            process.unwinder_checked.add(key)
            if root is None:
                try:
                    root = procfs.process_root(thread.tgid)
                except ProcessError:
                    return
            path = mapped_file(thread.tgid, mapping, root)
            if path is None:
                continue
            for role, offset in unwinder_entry_points(path):
                holder = next(
                    (
                        m
                        for m in mappings
                        if m.file_key == key and m.executable and m.contains_file_offset(offset)
                    ),
                    None,
                )
                if holder is None:
                    continue
                address = holder.address_of(offset)
                existing = process.breakpoints.get(address)
                if existing is not None:
                    existing.internal = role
                    continue
                try:
                    self.insert(thread, holder, address, offset, None, internal=role)
                except PtraceError as error:
                    self.counters.notes.append(
                        f"C++ exceptions through return probes unsupported: {error.message}"
                    )

    def slot(self, thread: Thread, near: int, batch: int = 1) -> int:
        process = thread.process
        slot = xol.take_slot(process, near)
        if slot is not None:
            return slot
        size = max(
            arch.PAGE_SIZE,
            (batch + 2) * arch.SLOT_SIZE + arch.PAGE_SIZE - 1 & ~(arch.PAGE_SIZE - 1),
        )
        start, in_reach = xol.allocate_area(self.injector, thread, near, near + 1, size)
        self.counters.xol_pages += size // arch.PAGE_SIZE
        xol.add_area(process, start, size)
        slot = xol.take_slot(process, near if in_reach else None)
        if slot is None:
            raise PtraceError(f"no XOL slot available in process {thread.tgid}")
        return slot

    def make_trampoline(self, thread: Thread, mapping: Mapping) -> None:
        process = thread.process
        slot = xol.take_slot(process, None)
        if slot is None:
            slot = self.slot(thread, mapping.start, 8)
        process.memory.write_code(slot, arch.BREAKPOINT * arch.SLOT_SIZE, thread.tid)
        process.trampoline = slot

    def install_rendezvous(self, thread: Thread, mappings: list[Mapping]) -> None:
        process = thread.process
        try:
            auxv = procfs.read_auxv(thread.tgid)
        except ProcessError:
            return
        found = rendezvous.from_dt_debug(thread.tgid, process.memory, auxv)
        if found is None:
            found = rendezvous.from_interpreter(thread.tgid, auxv, mappings)
        if found is None:
            return
        mapping = next((m for m in mappings if m.start <= found.r_brk < m.end), None)
        if mapping is None:
            return
        if found.r_brk not in process.breakpoints:
            try:
                self.insert(
                    thread,
                    mapping,
                    found.r_brk,
                    found.r_brk - mapping.start + mapping.offset,
                    None,
                    internal="rendezvous",
                )
            except PtraceError as error:
                self.counters.notes.append(f"dlopen tracking off: {error.message}")
                return
        else:
            process.breakpoints[found.r_brk].internal = "rendezvous"
        found.changed(process.memory)
        process.rendezvous = found

    def rescan(self, thread: Thread) -> None:
        process = thread.process
        process.last_scan = time.monotonic()
        try:
            mappings = process.mappings()
        except ProcessError:
            return
        self.apply(thread, mappings)
        if process.rendezvous is None:
            self.install_rendezvous(thread, mappings)

    def maybe_rescan(self, thread: Thread) -> None:
        process = thread.process
        if process.rendezvous is None and time.monotonic() - process.last_scan > _SCAN_INTERVAL:
            self.rescan(thread)

    def rendezvous_hit(self, thread: Thread) -> None:
        process = thread.process
        found = process.rendezvous
        if found is None:
            return
        state = found.state(process.memory)
        if state not in (None, rendezvous.RT_CONSISTENT):
            return
        if state is None or found.changed(process.memory):
            self.rescan(thread)

    # -- threads and processes coming and going ----------------------------------------------
