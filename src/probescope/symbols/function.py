"""FunctionSymbol: one probe-able function of a binary: names, versions and uprobe file offset."""

from __future__ import annotations

from typing import NamedTuple


class FunctionSymbol(NamedTuple):
    """A function as the kernel needs it: `offset` is the file offset a uprobe takes.

    `name` is the plain name (no `@VERSION`); `version` is the symbol version of that name (None
    when unversioned) and `is_default_version` says `@@` rather than `@`. `aliases` holds the
    other names defined at the same address, each spelled with its version (`__libc_malloc`,
    `memcpy@GLIBC_2.2.5`). `vaddr` is the link-time address (`st_value`), `size` is `st_size`
    (0 when the assembler gave none). `binding` is `global`, `weak`, `local` or `unique`.
    `is_ifunc` marks STT_GNU_IFUNC: `offset` is then the *resolver*, which runs once at load
    time — see probescope.symbols.ifunc. `source` says which table the name came from:
    `dynsym`, `symtab`, `build-id` / `debuglink` (a separate debug file) or `minidebuginfo`.
    """

    name: str
    version: str | None
    is_default_version: bool
    aliases: tuple[str, ...]
    vaddr: int
    size: int
    offset: int
    binding: str
    is_ifunc: bool
    source: str

    @property
    def display_name(self) -> str:
        """`name`, `name@VER` or `name@@VER` as `objdump -T` and the linker spell it."""
        return versioned_name(self.name, self.version, self.is_default_version)

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling this function answers to: display name first, then the aliases."""
        return (self.display_name, *self.aliases)

    @property
    def end_offset(self) -> int:
        return self.offset + self.size

    def contains_offset(self, offset: int) -> bool:
        return self.offset <= offset < self.offset + self.size or offset == self.offset

    @property
    def kind(self) -> str:
        return "ifunc" if self.is_ifunc else "func"


def versioned_name(name: str, version: str | None, is_default: bool) -> str:
    if version is None:
        return name
    return f"{name}@@{version}" if is_default else f"{name}@{version}"


def split_versioned_name(text: str) -> tuple[str, str | None, bool | None]:
    """Split a symbol spelling into (name, version, is_default).

    `name@@VER` → (name, VER, True); `name@VER` → (name, VER, False); `name` → (name, None, None).
    """
    at = text.find("@")
    if at <= 0:
        return text, None, None
    if text.startswith("@@", at):
        return text[:at], text[at + 2 :] or None, True
    return text[:at], text[at + 1 :] or None, False
