"""No import cycles in the ``checkfree`` package, subpackages and their ``__init__`` included.

Every module is parsed (ast, never imported) and every import of a ``checkfree.*`` module counts: at module
level, under ``if TYPE_CHECKING:``, and inside functions (a deferred import hides a cycle, it does not remove
it). ``from checkfree.x import y`` counts as an edge to ``checkfree.x.y`` when that is a module, else to
``checkfree.x``. Importing ``checkfree.x.y`` runs ``checkfree/x/__init__.py`` first, so every module also has an
edge to its parent package: a package ``__init__`` that imports its own submodules is a cycle. A string literal
that names a ``checkfree`` module (``"checkfree.swarm.cli"``) counts too: that is how ``importlib.import_module``
is handed a module (the CLI's sub-command table), and an import by name is an import (a logger's name given to
``logging.getLogger`` is not).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import checkfree

PACKAGE_ROOT = Path(checkfree.__file__).resolve().parent


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``root`` (a package named ``root.name``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a known module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, known: dict[str, Path], top: str) -> set[str]:
    """The known modules that ``module`` imports anywhere in its file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    parent = module.rpartition(".")[0]
    if parent and parent in known:
        targets.add(parent)  # importing a module runs its package's __init__ first
    loggers = {  # logging.getLogger("checkfree.x"): a logger's name, not an import
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger"
        for arg in node.args
    }
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        if isinstance(node, ast.Constant) and node.value in known and id(node) not in loggers:
            names = [node.value]  # a module named in a string: importlib.import_module(name)
        for name in names:
            if name == top or name.startswith(top + "."):
                target = _resolve(name, known)
                if target is not None and target != module:
                    targets.add(target)
    return targets


def import_graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports_of(m, p, known, root.name) for m, p in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, …, a]``, or None when the graph is acyclic (iterative DFS)."""
    colour = dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child, 2) == 1:
                return path[path.index(child) :] + [child]
            elif colour.get(child, 2) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_the_checkfree_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE_ROOT)
    assert "checkfree.swarm.node.node" in graph and len(graph) > 50
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_planted_cycle_is_found_whatever_form_its_imports_take(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.c import C\n"
    )
    (pkg / "sub" / "c.py").write_text("def f():\n    from .. import a\n    return a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg", "pkg.sub.b"} and graph["pkg.sub.c"] == {"pkg.a", "pkg.sub"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(pkg)) is None


def test_a_cycle_through_a_module_imported_by_name_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(
        'import importlib\nCOMMANDS = ("pkg.sub_cli",)\n'
        "def build():\n    return [importlib.import_module(n) for n in COMMANDS]\n"
        'DOC = "not a module: pkg.nothing"\n'
    )
    (pkg / "sub_cli.py").write_text("def helper():\n    from pkg.cli import build\n    return build\n")
    graph = import_graph(pkg)
    assert graph["pkg.cli"] == {
        "pkg",
        "pkg.sub_cli",
    }  # the string names a module; the docstring-like one does not
    assert find_cycle(graph) == ["pkg.cli", "pkg.sub_cli", "pkg.cli"]
    (pkg / "sub_cli.py").write_text('import logging\nlog = logging.getLogger("pkg.cli")\n')
    assert find_cycle(import_graph(pkg)) is None  # a logger's name is no import


@pytest.mark.parametrize("edge", [("checkfree.swarm.wire.netem", "checkfree.swarm.topology")])
def test_the_real_graph_would_fail_with_a_planted_edge(edge: tuple[str, str]) -> None:
    graph = import_graph(PACKAGE_ROOT)
    src, dst = edge
    assert find_cycle({**graph, dst: graph[dst] | {src}}) is not None


LONG_MODULE_LINES = 800
"""Above this, a module's docstring must say why it is one concept (the word "concept" in its docstring)."""


def long_modules_without_reason(root: Path, limit: int = LONG_MODULE_LINES) -> dict[str, int]:
    """Module name → line count, for every module of ``root`` longer than ``limit`` lines whose docstring does
    not give the reason it is one file (a sentence with the word "concept")."""
    found = {}
    for name, path in modules(root).items():
        text = path.read_text()
        n = len(text.splitlines())
        doc = ast.get_docstring(ast.parse(text)) or ""
        if n > limit and "concept" not in doc.lower():
            found[name] = n
    return found


def test_a_module_above_800_lines_says_why_it_is_one_concept() -> None:
    """Files are split by concept, not by line count; a very long file gives its reason."""
    assert long_modules_without_reason(PACKAGE_ROOT) == {}


def test_a_long_module_without_a_reason_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "short.py").write_text("x = 1\n" * 800)
    (pkg / "long.py").write_text("x = 1\n" * 801)
    (pkg / "reasoned.py").write_text('"""One concept: all of it."""\n' + "x = 1\n" * 801)
    assert long_modules_without_reason(pkg) == {"pkg.long": 801}


def test_a_package_init_that_imports_its_own_submodule_is_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    return 1\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.a"] == {"pkg.sub"}
    assert find_cycle(graph) == ["pkg.sub", "pkg.sub.a", "pkg.sub"]
    (pkg / "sub" / "__init__.py").write_text('"""Docstring only."""\n')
    assert find_cycle(import_graph(pkg)) is None
