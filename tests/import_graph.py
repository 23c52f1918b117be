"""The import graph of ``pfl_cli``, read from the source (no module is imported).

Each ``import`` statement of a ``pfl_cli`` module becomes an edge to the ``pfl_cli`` module it
loads, tagged by when it runs:

- ``top``: at import time (module body, class bodies, ``if``/``try`` blocks at module level);
- ``function``: when a function runs (an import inside a ``def``, the usual way pflx defers
  torch or a heavy sibling);
- ``typing``: never (under ``if TYPE_CHECKING:``).

Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, so an edge to a
module is also an edge to every package above it. ``python tests/import_graph.py`` prints
the strongly connected components (the import cycles) of the top-level graph and of the
graph with function-level imports added.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pfl_cli"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for file in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(file.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = file
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, kind) for every import statement, kind "top", "function" or "typing"."""
    def walk(node, kind):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "function" if kind == "top" else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)
    yield from walk(tree, "top")


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, known: set[str]) -> list[str]:
    """The pfl_cli modules an import statement loads (the deepest existing module of each name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = here.split(".")
            anchor = parts if is_package else parts[:-1]
            anchor = anchor[:len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        # `from a import b` loads a.b when b is a submodule, else a (which defines b).
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] == PACKAGE:
            out.append(name)
    return out


def imports(root: Path = ROOT) -> dict[str, list[tuple[str, str]]]:
    """module -> (imported pfl_cli module, kind) for each import statement of its source."""
    found = modules(root)
    known = set(found)
    out = {}
    for name, file in found.items():
        tree = ast.parse(file.read_text(), filename=str(file))
        out[name] = [(target, kind) for node, kind in _imports(tree)
                     for target in _targets(node, name, file.name == "__init__.py", known)]
    return out


def graph(kinds: tuple[str, ...] = ("top",), root: Path = ROOT, *,
          parsed: dict[str, list[tuple[str, str]]] | None = None) -> dict[str, set[str]]:
    """module -> the pfl_cli modules it imports (with the packages above them), for imports of ``kinds``.

    ``parsed``: the result of :func:`imports` when the caller has it already.
    """
    parsed = imports(root) if parsed is None else parsed
    edges: dict[str, set[str]] = {name: set() for name in parsed}
    for name, found in parsed.items():
        for target, kind in found:
            if kind in kinds:
                while target:
                    # A module's own package is already loading when its body runs: no edge to it.
                    if target != name and not name.startswith(target + "."):
                        edges[name].add(target)
                    target = target.rpartition(".")[0]
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found, key=lambda c: (-len(c), c))


def main() -> None:
    parsed = imports()
    for title, kinds in (("top-level imports", ("top",)), ("top-level and function-level imports", ("top", "function"))):
        edges = graph(kinds, parsed=parsed)
        found = cycles(edges)
        print(f"# {title}: {len(edges)} modules, {sum(map(len, edges.values()))} edges, {len(found)} cycle(s)")
        for component in found:
            print(f"  {len(component)} modules:")
            members = set(component)
            for name in component:
                print(f"    {name} -> {', '.join(sorted(edges[name] & members))}")


if __name__ == "__main__":
    main()


def defined_functions(root: Path = ROOT) -> dict[str, set[str]]:
    """Every module's top-level function names, read from the source."""
    out = {}
    for name, path in modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out[name] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out
