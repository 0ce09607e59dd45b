"""The layers of ARCHITECTURE.md, held against the code's own imports.

Each top-level package (or module) of probescope has a level; a module imports only its own
package and packages of a lower level — lazily inside a function, under TYPE_CHECKING or at the
top alike. No module imports a private name (`_x`) of another package. The table below is the
one in ARCHITECTURE.md; change both together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[2] / "src" / "probescope"

# package (the first name under probescope) -> level; lower levels never import higher ones.
LEVELS = {
    "errors": 0,
    "language": 1,
    "system": 2,
    "symbols": 3,
    "events": 4,
    "traceevent": 5,
    "engines": 6,
    "aggregate": 7,
    "sinks": 8,
    "record": 9,
    "session": 10,
    "aggregations": 11,
    "cli": 12,
    "__main__": 13,
}
# The package's face re-exports the public API from every layer (lazily).
EXEMPT = {"__init__"}
# Lower, but still not to be imported: a sink never knows which engine produced an event.
FORBIDDEN = {("sinks", "engines")}


def modules() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def package_of(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("probescope", *parts))


def imports_of(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names) of every probescope import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("probescope."):
                    found.append((node.lineno, alias.name, ()))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == "probescope" or module.startswith("probescope."):
                found.append((node.lineno, module, tuple(a.name for a in node.names)))
    return found


def target_package(module: str, names: tuple[str, ...]) -> list[str]:
    parts = module.split(".")
    if len(parts) > 1:
        return [parts[1]]
    return list(names)  # `from probescope import cli`


def test_every_package_has_a_level() -> None:
    unknown = {package_of(p) for p in modules()} - set(LEVELS) - EXEMPT
    assert not unknown, f"add these to LEVELS and to ARCHITECTURE.md: {sorted(unknown)}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SOURCE)))
def test_imports_point_down(path: Path) -> None:
    package = package_of(path)
    if package in EXEMPT:
        return
    level = LEVELS[package]
    wrong = []
    for line, module, names in imports_of(path):
        for target in target_package(module, names):
            if target == package or target == "__version__":
                continue
            if LEVELS.get(target, -1) >= level or (package, target) in FORBIDDEN:
                wrong.append(f"line {line}: {module} ({target}, level {LEVELS.get(target)})")
    assert not wrong, f"{package} (level {level}) imports upward or sideways: {wrong}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SOURCE)))
def test_no_private_names_across_packages(path: Path) -> None:
    package = package_of(path)
    wrong = []
    for line, module, names in imports_of(path):
        parts = module.split(".")
        other = parts[1] if len(parts) > 1 else None
        if other is None or other == package:
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        private += [p for p in parts[2:] if p.startswith("_") and not p.startswith("__")]
        if private:
            wrong.append(f"line {line}: {module} {private}")
    assert not wrong, f"{path.name} imports private names of another package: {wrong}"


def test_no_import_cycles() -> None:
    """Modules that import each other (directly or around a ring) read as one tangle, also when
    one side defers its import into a function to break the load-time loop; imports under
    TYPE_CHECKING do not count."""
    names = {module_name(p): p for p in modules()}
    graph = {name: sorted(_loaded_imports(path, names)) for name, path in names.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def _loaded_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Modules this one imports, at load time or lazily, TYPE_CHECKING blocks left out;
    `from pkg import mod` counts as importing `pkg.mod`."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    found: set[str] = set()
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in known:
                found.add(node.module)
            for alias in node.names:
                if f"{node.module}.{alias.name}" in known:
                    found.add(f"{node.module}.{alias.name}")
    found.discard(here)
    # A package's own __init__ importing its submodules is how packages load, not a tangle.
    return {m for m in found if not (path.name == "__init__.py" and m.startswith(here + "."))}


MAX_LINES = 600
# ARCHITECTURE.md says why each of these is larger; keep the two lists the same.
LARGER = {"language/fetchargs.py"}


def test_no_file_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(SOURCE)): len(p.read_text().splitlines()) for p in modules()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in LARGER}
    assert not over, f"split these by job (or list them in ARCHITECTURE.md and LARGER): {over}"
    architecture = (SOURCE.parents[1] / "ARCHITECTURE.md").read_text()
    assert all(f"`{name}`" in architecture for name in LARGER)
