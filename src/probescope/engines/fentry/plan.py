"""Where and how one function entry is patched, or why it is refused — from the file alone.

Two kinds of site (mechanisms.md §10):
- a nop site: the 5 bytes the compiler left at the entry for this purpose, listed in
  `__patchable_function_entries` or `__mcount_loc`; the jump replaces them and nothing is
  displaced;
- a detour: any other function; its first instructions (at least 5 bytes) move into the stub.
  Refused when that is not safe: the function is shorter than 5 bytes (unless it is a `ret` in
  alignment padding), a displaced instruction cannot move (relocate.classify), a direct branch
  anywhere in the function or its `.cold` parts lands strictly inside the patched bytes (a loop
  head), a symbol starts there, or the function holds an indirect jump (possibly a jump table
  into those bytes).
An `endbr64` first is kept in place and the jump goes after it, as ftrace does; events still
report the function's address.
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone  # type: ignore[import-untyped]

from probescope.engines.fentry.relocate import (
    ENDBR64,
    JMP_SIZE,
    RETURN,
    Displaced,
    Refused,
    classify,
    decode_lazily,
    flags_read,
    flags_written,
)
from probescope.symbols.entry_sites import EntrySites
from probescope.symbols.function import FunctionSymbol

_LITE = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_NOP5 = (b"\x90" * 5, b"\x0f\x1f\x44\x00\x00", b"\x0f\x1f\x44\x00\x08")
_BRANCHES = frozenset(
    {"jmp", "call", "loop", "loope", "loopne", "jrcxz", "jecxz", "jcxz", "ja", "jae", "jb",
     "jbe", "je", "jne", "jg", "jge", "jl", "jle", "jo", "jno", "jp", "jnp", "js", "jns"}
)  # fmt: skip
_MAX_SWEEP = 1 << 20


@dataclass(frozen=True)
class SitePlan:
    """One function entry as the engine patches it (all offsets are file offsets)."""

    path: str
    function: str
    function_offset: int  # what events report as ip
    patch_offset: int
    original: bytes  # the file's bytes the jump replaces
    displaced: tuple[Displaced, ...] = ()
    nop: bool = False

    @property
    def length(self) -> int:
        return len(self.original)

    @property
    def ends_in_stub(self) -> bool:
        """The displaced code ends with the function's `ret`: no jump back."""
        return bool(self.displaced) and self.displaced[-1].kind == RETURN


_PLANS: dict[tuple[str, int, int, int, bool], SitePlan | str] = {}


def plan_entry(sites: EntrySites, function: FunctionSymbol, *, hook: bool = False) -> SitePlan:
    """The patch for `function`'s entry; raises Refused with the reason.

    `hook`: one of the engine's own hooks (the dynamic linker's rendezvous, exec, the
    unwinder's entry points) — known functions whose indirect jumps leave them (the unwinder
    installs a landing pad with `jmp *%rcx`) and whose early calls may be displaced.
    Plans are kept per file identity (a file that changes gets planned again)."""
    key = (sites.path, sites.identity.inode, sites.identity.mtime_ns, function.offset, hook)
    known = _PLANS.get(key)
    if known is None:
        try:
            known = _plan(sites, function, hook)
        except Refused as why:
            known = str(why)
        _PLANS[key] = known
    if isinstance(known, str):
        raise Refused(known)
    return known


def _plan(sites: EntrySites, function: FunctionSymbol, hook: bool) -> SitePlan:
    name = function.display_name
    if not function.size:
        raise Refused(f"{name} has no size in the symbol table: its code cannot be checked")
    body = sites.code(function.offset, min(function.size, _MAX_SWEEP))
    start = function.offset
    if body.startswith(ENDBR64):
        start += len(ENDBR64)
    if start in sites.nop_entries or function.offset in sites.nop_entries:
        head = sites.code(start, JMP_SIZE)
        if head in _NOP5:
            return SitePlan(sites.path, name, function.offset, start, head, nop=True)
    return _plan_detour(sites, function, body, start, hook)


def _plan_detour(
    sites: EntrySites, function: FunctionSymbol, body: bytes, start: int, hook: bool
) -> SitePlan:
    name = function.display_name
    vaddr = sites.vaddr(function.offset)
    head_vaddr = vaddr + start - function.offset
    head = body[start - function.offset :]
    displaced: list[Displaced] = []
    covered = 0
    flags_set: set[str] = set()
    for insn in decode_lazily(head[: JMP_SIZE + 15], head_vaddr):
        if covered >= JMP_SIZE:
            break
        try:
            item = classify(insn, head_vaddr, allow_calls=hook)
        except Refused as why:
            raise Refused(f"{name}: {why}") from None
        unset = flags_read(insn) - flags_set
        if unset:
            raise Refused(
                f"{name}: '{item.text}' at +{item.offset:#x} reads the incoming "
                f"{'/'.join(sorted(unset))} flags, which the stub does not preserve"
            )
        flags_set |= flags_written(insn)
        if displaced and displaced[-1].kind == RETURN:
            raise Refused(f"{name}: a ret inside the first {JMP_SIZE} bytes")
        displaced.append(item)
        covered += insn.size
    if covered < JMP_SIZE:
        covered = _padded_return(sites, function, name, start, displaced, covered)
    patch_end = start + covered
    _check_sweep(sites, function, vaddr, start, patch_end, indirect_ok=hook)
    for offset, other in sites.symbols_inside(start, patch_end):
        raise Refused(
            f"{name}: symbol {other} starts at +{offset - function.offset:#x}, inside the "
            f"{covered} bytes a detour replaces"
        )
    for offset in sites.nop_entries:
        if start < offset < patch_end:
            raise Refused(f"{name}: a patchable entry at +{offset - function.offset:#x}")
    return SitePlan(
        sites.path, name, function.offset, start, sites.code(start, covered), tuple(displaced)
    )


def _padded_return(
    sites: EntrySites,
    function: FunctionSymbol,
    name: str,
    start: int,
    displaced: list[Displaced],
    covered: int,
) -> int:
    """A function shorter than the jump: allowed when it ends in `ret` followed by alignment
    padding (nop/int3) that no symbol starts in, so the jump may cover the padding."""
    end = function.offset + function.size
    if not displaced or displaced[-1].kind != RETURN or start + covered != end:
        raise Refused(
            f"{name} is {end - start} bytes long after its entry; a detour needs {JMP_SIZE}"
        )
    if not _is_padding(sites, end, start + JMP_SIZE):
        raise Refused(
            f"{name} is {end - start} bytes long and not followed by alignment padding; "
            f"a detour needs {JMP_SIZE}"
        )
    if sites.symbols_inside(end - 1, start + JMP_SIZE):
        raise Refused(f"{name} is {end - start} bytes long and another symbol follows at once")
    return JMP_SIZE


def _is_padding(sites: EntrySites, start: int, end: int) -> bool:
    """Whether [start, end) lies in alignment fill: int3s or nop instructions decoded from
    `start` (compilers pad with multi-byte nops such as `nopw %cs:0(%rax,%rax)`)."""
    code = sites.code(start, end - start + 16)
    cursor = 0
    for _, size, mnemonic, _ in _LITE.disasm_lite(code, 0):
        if cursor >= end - start:
            return True
        if mnemonic not in ("nop", "int3"):
            return False
        cursor += size
    return cursor >= end - start


def _check_sweep(
    sites: EntrySites,
    function: FunctionSymbol,
    vaddr: int,
    start: int,
    patch_end: int,
    *,
    indirect_ok: bool = False,
) -> None:
    """Decode the whole function and its .cold parts: no branch into the patched bytes, no
    indirect jump."""
    name = function.display_name
    low = vaddr + start - function.offset
    high = vaddr + patch_end - function.offset
    parts = [function, *sites.cold_parts(function)]
    for part in parts:
        if not part.size:
            continue
        code = sites.code(part.offset, min(part.size, _MAX_SWEEP))
        part_vaddr = sites.vaddr(part.offset)
        decoded = 0
        for address, size, mnemonic, operands in _LITE.disasm_lite(code, part_vaddr):
            decoded += size
            if mnemonic in _BRANCHES or mnemonic.startswith(("notrack", "bnd")):
                words = operands.split()
                target = _immediate(words[-1]) if words else None
                if target is None:
                    if not indirect_ok and not mnemonic.endswith("call"):
                        raise Refused(
                            f"{name}: an indirect jump at +{address - vaddr:#x} "
                            f"('{mnemonic} {operands}') may be a jump table into the patched "
                            "bytes"
                        )
                    continue
                if low < target < high:
                    raise Refused(
                        f"{name}: '{mnemonic} {operands}' at +{address - vaddr:#x} jumps to "
                        f"+{target - vaddr:#x}, inside the {patch_end - start} bytes a detour "
                        "replaces (a loop head)"
                    )
        if decoded < len(code):
            raise Refused(
                f"{name}: cannot decode {part.display_name} past +{decoded:#x} (data in code?)"
            )


def _immediate(text: str) -> int | None:
    try:
        return int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return None
