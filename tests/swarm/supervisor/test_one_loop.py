"""The supervisor's loop is the only loop of the supervisor package that receives messages, and its phases never
send (issue 38; docs/swarm.md, "The supervisor's loop"). Counted on the source's syntax tree, so a receive or a
waiting loop added anywhere else fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import checkfree.swarm.supervisor as package

ROOT = Path(package.__file__).parent
WAITS = {"recv", "serve", "sleep", "drive", "poll", "wait"}
"""Calls that wait for messages or time: a ``while`` loop calling one is a waiting loop."""
SENDS = {
    "send", "broadcast", "command", "kill", "spawn", "mark_dead", "recv", "write", "connect", "replace_dead",
    "plan_event", "answer_replans", "begin", "commit", "abort", "retry", "grant", "disconnect", "adopt",
}  # fmt: skip
"""Methods of the parts that reach a process, a socket or a file: a phase names them in an action, never calls them."""


def _functions(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out += [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, ast.FunctionDef)]
        elif isinstance(node, ast.Module):
            out += [(f.name, f) for f in node.body if isinstance(f, ast.FunctionDef)]
    return out


def _called(node: ast.AST) -> set[str]:
    names = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = call.func
        names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _sources() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in sorted(ROOT.rglob("*.py"))}


def receives_and_waiting_loops(sources: dict[str, ast.AST]) -> tuple[set[str], set[str]]:
    """(the functions that call ``.recv(``, the functions with a ``while`` loop that waits)."""
    receives, loops = set(), set()
    for path, tree in sources.items():
        for name, func in _functions(tree):
            calls = [
                n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            ]
            if any(c.func.attr == "recv" for c in calls):
                receives.add(f"{path}:{name}")
            if any(isinstance(n, ast.While) and _called(n) & WAITS for n in ast.walk(func)):
                loops.add(f"{path}:{name}")
    return receives, loops


def test_the_supervisors_loop_is_the_only_loop_that_receives() -> None:
    receives, loops = receives_and_waiting_loops(_sources())
    # Link.recv is the transport's wrapper; Supervisor.serve is the loop's receive, called only by drive
    assert receives == {"link.py:Link.recv", "supervisor.py:Supervisor.serve"}
    assert loops == {"supervisor.py:Supervisor.drive", "supervisor.py:Supervisor.serve"}
    callers = {
        f"{path}:{name}"
        for path, tree in _sources().items()
        for name, func in _functions(tree)
        if "serve"
        in {
            c.func.attr
            for c in ast.walk(func)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
        }
    }
    assert callers == {"supervisor.py:Supervisor.drive"}


def test_a_waiting_loop_added_elsewhere_is_counted() -> None:
    """The count sees a loop of the old kind (the plant this test was seen failing on)."""
    sources = _sources()
    sources["phases/planted.py"] = ast.parse(
        "class P:\n    def wait(self, sup):\n        while True:\n            sup.serve(0.02)\n"
        "    def take(self, link):\n        return link.recv(0)\n"
    )
    receives, loops = receives_and_waiting_loops(sources)
    assert "phases/planted.py:P.wait" in loops and "phases/planted.py:P.take" in receives


def test_no_phase_sends_waits_or_journals() -> None:
    for path, tree in _sources().items():
        if not path.startswith("phases/"):
            continue
        attribute_calls = {
            n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        assert not attribute_calls & (SENDS | WAITS), (path, attribute_calls & (SENDS | WAITS))
        imported = {
            alias.name if isinstance(n, ast.Import) else n.module
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for alias in n.names
        }
        forbidden = {"checkfree.swarm.supervisor.link", "checkfree.swarm.supervisor.processes", "time"}
        assert not imported & forbidden - ({"time"} if path == "phases/resuming.py" else set()), (
            path,
            imported,
        )
