"""Every module of the package logs under its own name (``logging.getLogger(__name__)``), so a log line says
where it came from; handlers and the level are set once on :data:`checkfree.PACKAGE_LOG` (issue 38)."""

from __future__ import annotations

import ast

from helpers import ROOT


def test_no_logger_is_named_by_a_string_literal() -> None:
    literal = []
    for path in sorted((ROOT / "checkfree").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and not (
                    len(node.args) == 1
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == "__name__"
                )
            ):
                literal.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert literal == [], f"getLogger without __name__: {literal}"
